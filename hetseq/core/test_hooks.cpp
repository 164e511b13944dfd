#include "hetseq/core/test_hooks.h"

#include <utility>

namespace hetseq {
namespace {

TestHooks& installed() {
  static TestHooks hooks;
  return hooks;
}

}  // namespace

// Note [Test hooks]
// ~~~~~~~~~~~~~~~~~
// Some tests must act on a running program at a point they choose, not at one they hit by luck: the balancer's
// tests make one rank slow by a fixed cost per micro-batch (tests/balance/test_sit_out.cpp), the save tests hold a
// save with its bytes written and kill the process or freeze the disk there (Note [Save pause],
// tests/support/save_pause.cpp). The library offers the points and nothing else: a TestHooks of functions that
// are empty unless a test installs them, so that hetseq-train has no test switch a user could set (issue 47; the
// library read HETSEQ_TEST_MICRO_BATCH_DELAY and HETSEQ_TEST_SAVE_PAUSE before). What a hook does, and the
// environment variables that choose it, are test code: tests/support/hooked_train.cpp installs them in
// hetseq-train-hooked, the tests' own build of hetseq-train's entry point, and in the forked stand-in for it
// (Note [Forked test programs], tests/support/subprocess.cpp); a test in one process may install its own.
// The points:
//  - before_micro_batch: Controller, before each micro-batch's forward pass and before a probe pass;
//  - checkpoint_file_written: inside write_file_atomically's callback, once the bytes are written and before the
//    sync and the rename, at every checkpoint file (save_checkpoint and copy_file_atomically in
//    hetseq/checkpoint, the optimizer shards and their manifest in hetseq/shard/optimizer_shards.cpp).
// Why hooks in core and not an observer of the loop (hetseq/observe): the points lie below what an observer
// sees, inside a micro-batch and inside a file write of the checkpoint module, which sits under the training
// loop; one struct of empty functions reaches both without either module knowing of tests.
// Without a hook a point costs one test of an empty std::function.
TestHooks set_test_hooks(TestHooks hooks) { return std::exchange(installed(), std::move(hooks)); }

namespace detail {

void run_before_micro_batch_hook() {
  if (const auto& hook = installed().before_micro_batch) hook();
}

void run_checkpoint_file_written_hook(const std::filesystem::path& path) {
  if (const auto& hook = installed().checkpoint_file_written) hook(path);
}

}  // namespace detail
}  // namespace hetseq
