#pragma once
// hetseq-train-hooked: hetseq-train's entry point with the test hooks that the environment asks for installed
// first (Note [Test hooks], hetseq/core/test_hooks.cpp), so that the library reads no test switch and the tests
// still make a real program slow or hold its save: HETSEQ_TEST_MICRO_BATCH_DELAY (support/micro_batch_delay.h)
// and HETSEQ_TEST_SAVE_PAUSE (support/save_pause.h). Built from hooked_train_main.cpp beside hetseq-train; the
// test binary runs the same entry point in the programs it forks (Note [Forked test programs], subprocess.cpp).

#include <string>
#include <vector>

namespace hetseq::test {

/// The program's name, in build/bin beside hetseq-train.
inline constexpr const char* kHookedTrainProgram = "hetseq-train-hooked";

/// Installs the test hooks that kMicroBatchDelayEnv and kSavePauseEnv ask for in this process's environment (an
/// empty hook for a variable that is not set), replacing any installed before.
void install_test_hooks_from_environment();

/// hetseq-train-hooked's entry point: install_test_hooks_from_environment, then hetseq-train's (cli::train_main)
/// on `argv` (argv[0] first); returns its exit code.
int hooked_train_main(const std::vector<std::string>& argv);

/// `command` with hetseq-train (an element whose file name is hetseq-train, wherever it stands: after taskset or
/// env too) replaced by hetseq-train-hooked from the same folder. Throws std::invalid_argument when `command`
/// runs no hetseq-train.
std::vector<std::string> hooked(std::vector<std::string> command);

}  // namespace hetseq::test
