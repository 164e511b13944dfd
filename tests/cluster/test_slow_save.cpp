// Level 2: a checkpoint save that takes longer than --distributed-timeout, in real processes. The save
// directory is an ext4 filesystem on a loop device; rank 0's second save is held at a known point (Note
// [Save pause]) while the test freezes it (fsfreeze, the kernel's own mechanism for snapshots), then let go:
// it blocks in the kernel exactly as on a stalled shared filesystem, for three times the collective
// timeout, while rank 1 waits at the fence.
// See Note [Checkpoint fence]; the fence's own cases (rank 0 failing, dying) are in
// tests/world/test_rendezvous_keys.cpp. Needs root for the loop mount, as the Slurm test does.
#include <unistd.h>

#include <regex>
#include <thread>

#include <catch2/catch.hpp>

#include "hetseq/checkpoint/checkpoint_file.h"
#include "support/hooked_train.h"
#include "support/mnist_files.h"
#include "support/process_checks.h"
#include "support/run_output.h"
#include "support/save_pause.h"
#include "support/subprocess.h"

using namespace hetseq;
using namespace hetseq::test;
using namespace std::chrono_literals;

namespace {

ProcessResult shell(const std::string& command) { return run_process({"/bin/sh", "-c", command}, 120s); }

// An ext4 filesystem in a file, mounted through a loop device at `mount_point`; unfrozen and unmounted
// on destruction, so that a failed test leaves no frozen mount behind.
class LoopMount {
 public:
  LoopMount(const std::string& image, std::string mount_point) : mount_point_(std::move(mount_point)) {
    const ProcessResult made = shell("truncate -s 128M '" + image + "' && mkfs.ext4 -q '" + image + "' && mkdir -p '" +
                                     mount_point_ + "' && mount -o loop '" + image + "' '" + mount_point_ + "'");
    INFO("mounting a loop device needs root and the loop driver (CI has both):\n" << made.out << made.err);
    REQUIRE(made.exit_code == 0);
    mounted_ = true;
  }
  ~LoopMount() {
    if (!mounted_) return;
    shell("fsfreeze -u '" + mount_point_ + "' 2>/dev/null; umount '" + mount_point_ + "' || umount -l '" +
          mount_point_ + "'");
  }
  LoopMount(const LoopMount&) = delete;
  LoopMount& operator=(const LoopMount&) = delete;

 private:
  std::string mount_point_;
  bool mounted_ = false;
};

}  // namespace

TEST_CASE("a checkpoint save blocked three times longer than --distributed-timeout does not fail the other rank",
          "[cluster][checkpoint]") {
  REQUIRE(::geteuid() == 0);  // the loop mount and fsfreeze need root (CI runs as root)
  TempDir dir;
  write_random_mnist(dir.path(), 480, 40);  // 30 updates of 8 on each of 2 ranks
  LoopMount disk(dir / "disk.img", dir / "disk");
  constexpr int kTimeout = 3;  // --distributed-timeout, seconds
  constexpr int kFrozen = 3 * kTimeout;
  auto node = [&](const std::string& save_dir, const std::string& name) {
    return std::vector<std::string>{binary_path("hetseq-train"), "--task", "mnist", "--data", dir.path(), "--cpu",
                                    "--optimizer", "adam", "--lr", "0.001", "--num-workers", "0",
                                    "--intra-op-threads", "1", "--no-progress-bar", "--seed", "11", "--max-sentences",
                                    "8", "--distributed-gpus", "2", "--distributed-world-size", "2",
                                    "--distributed-init-method", "file://" + (dir / ("rdv-" + name)),
                                    "--distributed-timeout", std::to_string(kTimeout), "--rendezvous-timeout", "120",
                                    "--max-epoch", "1", "--save-dir", save_dir, "--save-interval-updates", "4",
                                    "--keep-interval-updates", "2", "--disable-validation", "--log-all-ranks"};
  };
  const ProcessResult straight = run_process(node(dir / "straight", "straight"), 300s);
  require_success(straight, "run on the normal disk");

  // Rank 0's second save (update 8; its third file write, after checkpoint_1_4.pt and its copy to
  // checkpoint_last.pt) is held with its bytes written (Note [Save pause]); the disk is
  // frozen, and only then is the save let go, into a rename that blocks in the kernel until the thaw:
  // the save is stalled for the whole freeze by construction, whatever the disk's speed or the load.
  const SavePause pause(dir / "pause");
  Process run(hooked(node(dir / "disk/save", "frozen")), {{kSavePauseEnv, pause.at(3)}});
  REQUIRE(run.wait_for_err("[save-pause]", 120s));
  CHECK_THAT(run.err_so_far(), Catch::Contains("checkpoint write 3 (" + (dir / "disk/save/checkpoint_1_8.pt)")));
  // The freeze lifts itself after kFrozen seconds even if this test dies in between.
  Process freezer({"/bin/sh", "-c",
                   "fsfreeze -f '" + (dir / "disk") + "' && echo frozen >&2 && sleep " + std::to_string(kFrozen) +
                       " && fsfreeze -u '" + (dir / "disk") + "'"});
  REQUIRE(freezer.wait_for_err("frozen", 60s));
  pause.release();
  const ProcessResult thawed = freezer.wait(std::chrono::seconds(kFrozen + 60));
  INFO("fsfreeze: " << thawed.out << thawed.err);
  REQUIRE(thawed.exit_code == 0);
  const ProcessResult frozen = run.wait(300s);
  require_success(frozen, "run whose save directory froze");

  // Rank 1 waited at the fence for the whole freeze, longer than a collective may wait, and said so.
  std::smatch m;
  REQUIRE(std::regex_search(frozen.err, m,
                            std::regex("rank 1 of 2 waited ([0-9.]+) s for rank 0 to write the checkpoint at update "
                                       "([0-9]+) \\(longer than --distributed-timeout; rank 0's heartbeat kept it "
                                       "waiting\\)")));
  CHECK(std::stod(m[1]) >= kFrozen - 1);  // the whole freeze (the fence's clock starts a little later)
  CHECK(m[2].str() == "8");
  // And the run is the run that never waited.
  check_same_training_state(load_checkpoint(dir / "straight/checkpoint_last.pt"),
                            load_checkpoint(dir / "disk/save/checkpoint_last.pt"));
  CHECK(load_checkpoint(dir / "disk/save/checkpoint_last.pt").num_updates == 30);
}
