// --shared-memory-reduce on real processes (level 2): two ranks of one node sum their gradients through shared
// memory, and train bit for bit as over Gloo (two terms add the same either way round).
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "hetseq/checkpoint/checkpoint_file.h"
#include "hetseq/core/error.h"
#include "support/mnist_files.h"
#include "support/run_output.h"
#include "support/subprocess.h"
#include "support/temp_dir.h"

using namespace hetseq::test;
using namespace std::chrono_literals;
using Catch::Matchers::Contains;

namespace {

ProcessResult train_two_ranks(const TempDir& data, const std::string& save_dir, const std::vector<std::string>& extra) {
  std::vector<std::string> args{binary_path("hetseq-train"), "--task", "mnist", "--data", data.path(), "--cpu",
                                "--distributed-gpus", "2", "--max-sentences", "16", "--max-update", "6",
                                "--optimizer", "adam", "--lr", "0.001", "--seed", "5", "--disable-validation",
                                "--log-format", "json", "--log-interval", "1", "--save-dir", save_dir};
  args.insert(args.end(), extra.begin(), extra.end());
  return run_process(args, 300s);
}

// Note [A full /dev/shm in a test]
// The segment's failure is made real rather than simulated: the run goes into a mount namespace of its own
// (unshare(1); it needs root, as the [netns] tests' `ip netns` does) where /dev/shm is a fresh tmpfs of 1 MiB,
// so rank 0's posix_fallocate of the segment (about 3 x 4.8 MB of MNIST gradients per rank) fails with ENOSPC,
// as on a machine whose /dev/shm is full or too small for the model. The launcher's workers inherit the
// namespace, so every rank sees the same small /dev/shm, and the host's is untouched.
ProcessResult train_two_ranks_small_dev_shm(const TempDir& data, const std::string& save_dir,
                                            const std::vector<std::string>& extra) {
  std::vector<std::string> args{"/usr/bin/unshare", "--mount", "--propagation", "private", "/bin/sh", "-c",
                                "mount -t tmpfs -o size=1m hetseq-test-shm /dev/shm && exec \"$0\" \"$@\"",
                                binary_path("hetseq-train"), "--task", "mnist", "--data", data.path(), "--cpu",
                                "--distributed-gpus", "2", "--max-sentences", "16", "--max-update", "2",
                                "--optimizer", "sgd", "--lr", "0.01", "--seed", "5", "--disable-validation",
                                "--num-workers", "0", "--intra-op-threads", "1", "--no-progress-bar",
                                "--log-format", "json", "--log-interval", "1", "--save-dir", save_dir};
  args.insert(args.end(), extra.begin(), extra.end());
  return run_process(args, 120s);
}

}  // namespace

TEST_CASE("shared-memory reduction, two ranks of one node: they train bit for bit as over the process group",
          "[cli][shm][multiprocess]") {
  TempDir data;
  write_random_mnist(data.path(), 160, 20, 3);
  TempDir dir;
  const auto on = train_two_ranks(data, dir / "on", {"--shared-memory-reduce", "on"});
  INFO(on.err);
  REQUIRE(on.exit_code == 0);
  CHECK_THAT(on.err, Contains("the 2 ranks, all on this machine, sum their gradients through shared memory"));
  const auto automatic = train_two_ranks(data, dir / "auto", {});
  REQUIRE(automatic.exit_code == 0);
  CHECK_THAT(automatic.err, Contains("sum their gradients through shared memory"));
  const auto off = train_two_ranks(data, dir / "off", {"--shared-memory-reduce", "off"});
  REQUIRE(off.exit_code == 0);
  CHECK_THAT(off.err, !Contains("through shared memory"));

  CHECK(losses_by_update(on.out).size() == 6);
  CHECK(losses_by_update(on.out) == losses_by_update(off.out));
  check_same_training_state(hetseq::load_checkpoint(dir / "on/checkpoint_last.pt"),
                            hetseq::load_checkpoint(dir / "off/checkpoint_last.pt"));
}

TEST_CASE("shared-memory reduction: --shared-memory-reduce on with a compressing comm hook or --debug-collectives, or "
          "an unknown value, is a usage error naming the flags",
          "[cli][shm]") {
  TempDir data;
  write_random_mnist(data.path(), 64, 8, 3);
  TempDir dir;
  const auto hook = train_two_ranks(data, dir / "a", {"--shared-memory-reduce", "on", "--ddp-comm-hook", "fp16"});
  CHECK(hook.exit_code == hetseq::kExitUsage);
  CHECK_THAT(hook.err, Contains("--shared-memory-reduce sums float32 buckets as they are; it cannot be combined with "
                                "--ddp-comm-hook fp16"));
  const auto value = train_two_ranks(data, dir / "b", {"--shared-memory-reduce", "yes"});
  CHECK(value.exit_code == hetseq::kExitUsage);
  CHECK_THAT(value.err, Contains("--shared-memory-reduce: 'yes' is not one of auto, on, off"));
  // Buckets through shared memory would go around every check: Note [Shared memory and --debug-collectives].
  const auto checked = train_two_ranks(data, dir / "c", {"--shared-memory-reduce", "on", "--debug-collectives"});
  CHECK(checked.exit_code == hetseq::kExitUsage);
  CHECK_THAT(checked.err, Contains("--shared-memory-reduce on cannot be combined with --debug-collectives: gradient "
                                   "buckets summed through shared memory bypass the checks of every collective"));
}

TEST_CASE("shared-memory reduction with no room in /dev/shm: auto warns and trains over the process group, on is a "
          "usage error naming the flag",
          "[cli][shm][multiprocess][netns]") {
  TempDir data;
  write_random_mnist(data.path(), 64, 8, 3);
  TempDir dir;
  // Note [A full /dev/shm in a test]
  const auto automatic = train_two_ranks_small_dev_shm(data, dir / "auto", {});
  INFO(automatic.err);
  REQUIRE(automatic.exit_code == 0);
  CHECK_THAT(automatic.err,
             Contains("[reducer] rank 0: the ranks of this machine cannot sum their gradients through shared memory "
                      "(rank 0 cannot reserve ") &&
                 Contains("in /dev/shm (/hetseq-reduce-") && Contains("No space left on device") &&
                 Contains("they go through the process group instead, which is slower. Make room in /dev/shm, or pass "
                          "--shared-memory-reduce off to choose that"));
  CHECK_THAT(automatic.err, !Contains("all on this machine, sum their gradients through shared memory"));
  CHECK(losses_by_update(automatic.out).size() == 2);

  const auto on = train_two_ranks_small_dev_shm(data, dir / "on", {"--shared-memory-reduce", "on"});
  INFO(on.err);
  CHECK(on.exit_code == hetseq::kExitUsage);
  CHECK_THAT(on.err, Contains("error: --shared-memory-reduce on: rank 0 cannot reserve ") &&
                         Contains("No space left on device; free /dev/shm or use --shared-memory-reduce off"));
}
