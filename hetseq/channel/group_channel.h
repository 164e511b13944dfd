#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include "hetseq/channel/collective_channel.h"
#include "hetseq/channel/stat_sync.h"

namespace hetseq {

/// The CollectiveChannel of a distributed run, over the run's c10d process group: an update's statistics
/// and stop vote in one collective started before backward (StatSync, Note [Stat sync]), validation sums,
/// and gathers as allgathers. See Note [Communication roles].
class GroupChannel final : public CollectiveChannel {
 public:
  /// `device`: the model's device, where the task's device statistics live; `fast_stat_sync`:
  /// --fast-stat-sync (StatSync's fast mode); `host_group`: a Gloo group of the same ranks for the host's
  /// messages (needed where `device` is not the CPU: Note [Stat sync]), null: `group` carries them. Every
  /// rank builds one at the same point.
  GroupChannel(c10::intrusive_ptr<c10d::ProcessGroup> group, c10::Device device, bool fast_stat_sync,
               c10::intrusive_ptr<c10d::ProcessGroup> host_group = nullptr);

  using CollectiveChannel::start_update;
  int64_t rank() const override { return rank_; }
  int64_t world_size() const override { return world_size_; }
  void start_update(const LogSums& local, const LogTensors& device_values, bool stop) override;
  bool update_started() const override { return stats_.started(); }
  double update_sample_size() override { return stats_.sample_size(); }
  UpdateAgreement finish_update() override;
  LogSums sum(const LogSums& local) override { return stats_.sum(local); }
  const std::vector<LogSums>& last_per_rank() const override { return stats_.last_per_rank(); }
  /// One allgather of a float64 row per rank, in host memory on the host's group. Throws hetseq::PeerError naming the rank when it fails or
  /// times out, hetseq::InputError when the ranks' rows differ in length.
  std::vector<std::vector<double>> gather(const std::vector<double>& local) override;
  void set_tracer(std::shared_ptr<Tracer> tracer) override { tracer_ = std::move(tracer); }

 private:
  c10::intrusive_ptr<c10d::ProcessGroup> host_;  // the host group, else the group
  int64_t rank_ = 0;
  int64_t world_size_ = 1;
  StatSync stats_;
  std::shared_ptr<Tracer> tracer_;
};

}  // namespace hetseq
