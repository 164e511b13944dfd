#include "support/hooked_train.h"

#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <utility>

#include "hetseq/cli/train_command.h"
#include "hetseq/core/test_hooks.h"
#include "support/micro_batch_delay.h"
#include "support/save_pause.h"

namespace hetseq::test {

void install_test_hooks_from_environment() {
  TestHooks hooks;
  if (const char* file = std::getenv(kMicroBatchDelayEnv); file != nullptr && *file != '\0') {
    hooks.before_micro_batch = micro_batch_delay(file);
  }
  if (const char* spec = std::getenv(kSavePauseEnv); spec != nullptr) {
    hooks.checkpoint_file_written = save_pause_hook(spec);
  }
  set_test_hooks(std::move(hooks));
}

int hooked_train_main(const std::vector<std::string>& argv) {
  install_test_hooks_from_environment();
  return cli::train_main(argv);
}

std::vector<std::string> hooked(std::vector<std::string> command) {
  for (std::string& arg : command) {
    std::filesystem::path program(arg);
    if (program.filename() == "hetseq-train") {
      arg = program.replace_filename(kHookedTrainProgram).string();
      return command;
    }
  }
  throw std::invalid_argument("hooked(): the command runs no hetseq-train");
}

}  // namespace hetseq::test
