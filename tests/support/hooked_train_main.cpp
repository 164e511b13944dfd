// hetseq-train-hooked's main(): as hetseq-train's (hetseq/cli/train_main.cpp), with the test hooks that the
// environment asks for installed first (support/hooked_train.h).
#include <string>
#include <vector>

#include "hetseq/core/memory.h"
#include "support/hooked_train.h"

int main(int argc, char* argv[]) {
  hetseq::keep_freed_memory();  // See Note [Keeping freed memory]
  return hetseq::test::hooked_train_main(std::vector<std::string>(argv, argv + argc));
}
