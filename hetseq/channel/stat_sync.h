#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include "hetseq/channel/late_sums.h"
#include "hetseq/task/task.h"

namespace hetseq {

/// Sums the statistics of a step (LogSums) over the ranks of a process group. The distributed
/// reducer starts it before an update's last backward, so that its one collective overlaps the
/// gradient reduction, and calls it for validation. See Note [Stat sync].
class StatSync {
 public:
  /// `fast` (--fast-stat-sync): one allreduce of a float64 tensor (a second when the names change, on
  /// all ranks together); every rank must report the same names. Otherwise one allgather of every
  /// rank's values, which keeps each rank's values; when the names change, or differ between ranks,
  /// two more allgathers of the serialised sums, which tolerate different names. `device`: the model's
  /// device, where the task's device statistics live. `host_group`: a group of the same ranks for the
  /// host's rows (CPU tensors: Gloo), which the host reads at once while the device statistics travel on
  /// `group` and stay on the device (see Note [Stat sync]); null: `group` carries the host's rows, and the
  /// device statistics go with them, which needs `device` to be the CPU (the host reads them at no wait).
  StatSync(c10::intrusive_ptr<c10d::ProcessGroup> group, c10::Device device, bool fast,
           c10::intrusive_ptr<c10d::ProcessGroup> host_group = nullptr);

  /// Which sums a call belongs to: each channel remembers the names its ranks last agreed on, so that
  /// validation and the per-rank summaries between updates do not cost the updates a round.
  enum Channel { kUpdate = 0, kOther = 1 };
  /// Starts summing `local` over the ranks and returns without waiting: one collective (two with a host
  /// group and device statistics: the host's row, then the device's), which runs while the caller goes on
  /// (backward). Every rank must call it at the same point, and call finish() before the next start().
  /// `stop`: this rank's vote to stop the run (see Note [Clean stops]), counted in last_stop_votes().
  /// `device_values`: statistics on the device (the task's LogTensors, float64 scalars), summed with the rest
  /// (a name in both `local` and `device_values` sums both).
  void start(const LogSums& local, const LogTensors& device_values, Channel channel, bool stop);
  void start(const LogSums& local, Channel channel = kOther, bool stop = false) { start(local, {}, channel, stop); }
  /// Whether a sum was started and not finished.
  bool started() const { return pending_.has_value(); }
  /// The local sums the unfinished sum was started with.
  const LogSums& started_sums() const { return pending_->local; }
  /// The sum over the ranks of `sample_size` in the started sum (0 where a rank has none); waits for
  /// the started collective only. Valid whatever the names: the count has a slot of its own.
  double sample_size();
  /// The elementwise sum of the started `local` over all ranks (a name missing on a rank counts 0
  /// there). In the steady state it only waits for the collective start() began; when the names
  /// changed it runs more (see Note [Stat sync]). Throws hetseq::InputError naming the ranks when,
  /// with `fast`, the ranks report different names, and when a collective fails or times out.
  LogSums finish();
  /// The device statistics of the last finish() that are still on the device (with a host group, when the
  /// names did not change), summed over the ranks there; finish() left them out of its sums. Moves them out.
  LateSums take_late() { return std::move(late_); }
  /// start() and finish() together.
  LogSums sum(const LogSums& local, Channel channel = kOther);

  /// Each rank's sums from the last finish(), `[rank]`; empty with `fast` (the allreduce keeps only
  /// the totals). Without the device statistics that finish() left on the device (take_late()).
  const std::vector<LogSums>& last_per_rank() const { return per_rank_; }
  /// The collectives the last finish() had to start after start()'s own, and wait for: 0 in the
  /// steady state, more when the names changed. The counter of blocking statistics round trips.
  int64_t last_extra_rounds() const { return extra_rounds_; }
  /// The reads of the device the last finish() made: 0 in the steady state; 1 where the names changed and
  /// the device statistics had to join the host's (the first update, a rank without samples).
  int64_t last_host_reads() const { return host_reads_; }
  /// The number of ranks that voted to stop in the last started sum (known once it was waited for).
  int64_t last_stop_votes() const { return stop_votes_; }

 private:
  struct Pending {
    LogSums local;                            // the host's statistics, as start() was given them
    LogTensors device;                        // the device's statistics (with a host group)
    LogSums named;  // every name, a device statistic's with 0: the host's row's values in this order
    bool fits = false;  // this rank's names fit the layout the sum was cut for (count and device_count)
    Channel channel = kOther;
    int64_t count = 0;                        // the agreed number of names the buffer was laid out for
    int64_t device_count = 0;                 // of them, the agreed number of device statistics
    bool stop = false;                        // this rank's vote to stop
    c10::intrusive_ptr<c10d::Work> work;
    std::vector<torch::Tensor> in;            // fast: the summed buffer; gathered: this rank's row
    std::vector<std::vector<torch::Tensor>> out;  // gathered: [0][rank] every rank's row
    bool waited = false;
    // The device statistics' own collective on `group_` (with a host group, when device_count > 0).
    c10::intrusive_ptr<c10d::Work> device_work;
    std::vector<torch::Tensor> device_in;                // fast: the summed values; gathered: this rank's
    std::vector<std::vector<torch::Tensor>> device_out;  // gathered: [0][rank]
  };
  /// Lays out the host's row for `count` agreed names (the device statistics' names among them, as
  /// zeros) and the device's row for `device_count`, and starts their collectives.
  void launch(const LogSums& local, const LogTensors& device, Channel channel, int64_t count, int64_t device_count,
              bool stop);
  /// Waits for the device statistics' collective, if one was started.
  void wait_device();
  /// The steady state's end: the device statistics stay on the device (late_), out of `total` and per_rank_.
  void keep_device_late(LogSums& total);
  /// The host's statistics and the device's read on the host (a read, where the names changed).
  LogSums read_all();
  /// Waits for the pending collective (once) and returns the rows: fast, one summed row; gathered,
  /// one row per rank. On the host.
  const std::vector<torch::Tensor>& rows();
  LogSums finish_fast();
  LogSums finish_gathered();
  /// Two allgathers of the serialised sums: any names, every rank's values.
  LogSums sum_serialised(const LogSums& local);
  /// Waits for `work`; failures become hetseq::PeerError naming `what` (wait_for_peers).
  void wait(const c10::intrusive_ptr<c10d::Work>& work, const char* what) const;

  c10::intrusive_ptr<c10d::ProcessGroup> group_;
  c10::intrusive_ptr<c10d::ProcessGroup> host_;  // the host's rows: the host group, else group_
  bool split_;                                   // a host group was given: device statistics apart
  c10::Device device_;
  bool fast_;
  int64_t rank_;
  int64_t world_size_;
  int64_t agreed_count_[2] = {0, 0};  // [channel] the number of names all ranks reported the last time they agreed
  int64_t agreed_device_count_[2] = {0, 0};  // [channel] of them, device statistics (with a host group)
  std::optional<Pending> pending_;
  std::vector<torch::Tensor> rows_;  // the pending collective's result on the host
  LateSums late_;
  std::vector<LogSums> per_rank_;    // [rank]
  int64_t extra_rounds_ = 0;
  int64_t host_reads_ = 0;
  int64_t stop_votes_ = 0;
};

}  // namespace hetseq
