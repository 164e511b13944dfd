#pragma once
/// The points where a test reaches into a running program: a fixed cost before each micro-batch (a slow
/// rank), a hold once a checkpoint file's bytes are written (a save in progress). Only tests install hooks,
/// through set_test_hooks (tests/support/hooked_train.h installs them in the tests' hetseq-train-hooked);
/// the library reads no test switch from the environment. See Note [Test hooks].

#include <filesystem>
#include <functional>

namespace hetseq {

/// What a test runs at the library's hook points; an empty function is no hook (the default).
struct TestHooks {
  /// Runs on the training thread before each micro-batch's forward pass and before a balancer's probe pass
  /// (Controller), so that a test makes a rank slow by a fixed cost per micro-batch.
  std::function<void()> before_micro_batch;
  /// Runs once all the bytes of a checkpoint file are in its temporary file, before it is synced and renamed
  /// over `path`: for every file of a save (the checkpoint, each copy of it, each optimizer shard and shard
  /// manifest), so that a test holds a save at a known file. The files the tracer writes do not count.
  std::function<void(const std::filesystem::path& path)> checkpoint_file_written;
};

/// Installs `hooks` in this process (a process it forks keeps them) and returns those installed before.
/// Not synchronised with the hook points: call it before training starts, not while another thread trains.
TestHooks set_test_hooks(TestHooks hooks);

namespace detail {

/// The hook points: each runs its hook when one is installed and does nothing otherwise.
void run_before_micro_batch_hook();
void run_checkpoint_file_written_hook(const std::filesystem::path& path);

}  // namespace detail
}  // namespace hetseq
