#include "hetseq/cli/train_command.h"
#include "hetseq/core/memory.h"

int main(int argc, char* argv[]) {
  hetseq::keep_freed_memory();  // See Note [Keeping freed memory]
  return hetseq::cli::eval_main(argc, argv);
}
