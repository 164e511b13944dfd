#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/types.h>

#include "hetseq/world/handshake.h"
#include "hetseq/world/gloo_tls.h"
#include "hetseq/world/job_secret.h"
#include "hetseq/world/process_group.h"
#include "hetseq/world/rendezvous.h"
#include "hetseq/world/world_options.h"

namespace hetseq {

/// The CUDA device of a worker that sees `visible_devices` devices: its local rank (from torchrun or
/// Slurm) when one was given, else --device-id. A local rank beyond the devices this process sees,
/// when it sees exactly one, is a launcher that gave each worker its own device (Slurm's
/// --gpus-per-task=1, a CUDA_VISIBLE_DEVICES per worker): device 0 is that worker's. Throws
/// hetseq::UsageError naming the local rank or --device-id when there is no such device.
int64_t cuda_device_for(std::optional<int64_t> local_rank, int64_t device_id, int64_t visible_devices);

/// The ranks of a run and how they talk: rank, world size, this worker's device, and, once joined,
/// the store and the c10d process group. A single process is the trivial World (world size 1, no
/// store, no group). See Note [Joining a world].
class World {
 public:
  /// Resolves rank, world size, local rank and device from `options` and the environment (env://,
  /// Slurm) without talking to anyone. On CUDA, makes the worker's device current before any process
  /// group exists. Throws hetseq::UsageError on a conflict or a rank outside the world.
  explicit World(const WorldOptions& options);
  World(const World&) = delete;
  World& operator=(const World&) = delete;

  /// Rendezvous, start handshake (every rank's `mine` compared, see exchange_worker_info) and process
  /// group. Returns every rank's info [rank]; for a single process, just `mine`. Throws
  /// hetseq::InputError naming the ranks that disagree or never arrived.
  std::vector<WorkerInfo> join(WorkerInfo mine);

  /// Ends the run: waits for every rank at the final barrier, then leaves the process at once with
  /// `exit_code` (Gloo's teardown has been seen to spin for minutes). A single process just returns.
  void leave(int exit_code = 0);
  /// Ends the run and returns (a program that goes on, e.g. after hetseq::train): waits for every rank
  /// at the final barrier as leave() does. A single process just returns.
  void finish();
  /// On an error path: if this process joined a distributed world, leaves at once with `exit_code`
  /// without waiting for peers (they fail within their collective timeout). Otherwise returns.
  static void abandon(int exit_code);

  bool distributed() const { return distributed_; }
  int64_t rank() const { return rank_; }
  int64_t world_size() const { return world_size_; }
  std::optional<int64_t> local_rank() const { return local_rank_; }
  torch::Device device() const { return device_; }
  /// The collective backend: --distributed-backend, else nccl on CUDA, else gloo.
  const std::string& backend() const { return backend_; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  std::chrono::milliseconds checkpoint_timeout() const { return checkpoint_timeout_; }

  /// The rendezvous store (null before join() and for a single process).
  c10::intrusive_ptr<c10d::Store> store() const { return joined_ ? joined_->store : nullptr; }
  /// The process group (null before join() and for a single process).
  c10::intrusive_ptr<c10d::ProcessGroup> group() const { return group_; }
  /// A process group of `ranks` alone (in rank order, this rank among them; the ranks that take part in
  /// the updates while others sit out, Note [Sharing an update]), over the run's store with the run's
  /// backend and timeout. Every rank in `ranks` calls it at the same point, the others do not; each set is
  /// made once and kept, and the whole world is group().
  c10::intrusive_ptr<c10d::ProcessGroup> subgroup(const std::vector<int64_t>& ranks);
  /// A second process group of every rank, for `role`'s collectives (--zero-sharding full's parameter
  /// gathers), which run beside group()'s in their own order; over the run's store with the run's backend
  /// and timeout, made once per role. Every rank calls it at the same point.
  c10::intrusive_ptr<c10d::ProcessGroup> role_group(const std::string& role);
  /// A process group of `ranks` (empty: every rank) for messages in host memory (the statistics' host rows,
  /// gathers of per-rank figures: Note [Stat sync]): group() or subgroup(ranks) where the backend is Gloo,
  /// else a Gloo group of those ranks over the run's store with the run's timeout and transport, made once
  /// per set. Every rank in `ranks` calls it at the same point, the others do not.
  c10::intrusive_ptr<c10d::ProcessGroup> host_group(const std::vector<int64_t>& ranks = {});

 private:
  // The group of `ranks` (sorted, this rank among them) kept in `kept_groups`, made on first use over the run's
  // store under "`kind`/ranks" with `backend` (empty: the run's).
  c10::intrusive_ptr<c10d::ProcessGroup> kept_group(
      std::map<std::vector<int64_t>, c10::intrusive_ptr<c10d::ProcessGroup>>& kept_groups, const std::string& kind,
      const std::vector<int64_t>& ranks, const std::string& backend);
  // A process group over the run's store under `prefix`, this rank being `rank` of `size`, with `backend`
  // (empty: the run's).
  c10::intrusive_ptr<c10d::ProcessGroup> group_over(const std::string& prefix, int64_t rank, size_t size,
                                                    const std::string& backend = "") const;

  bool distributed_ = false;
  int64_t rank_ = 0;
  int64_t world_size_ = 1;
  std::optional<int64_t> local_rank_;
  torch::Device device_ = torch::kCPU;
  std::string backend_;
  std::chrono::milliseconds timeout_;
  std::chrono::milliseconds rendezvous_timeout_;
  std::chrono::milliseconds checkpoint_timeout_;
  bool debug_collectives_ = false;
  RendezvousOptions rendezvous_;
  std::string master_host_;  // tcp:// and env:// hosts, for Gloo's interface
  std::shared_ptr<const GlooTls> tls_;       // Gloo over TLS (Note [Gloo over TLS]), when used
  ProcessGroupOptions group_options() const;
  std::optional<Rendezvous> joined_;
  c10::intrusive_ptr<c10d::ProcessGroup> group_;
  std::map<std::vector<int64_t>, c10::intrusive_ptr<c10d::ProcessGroup>> subgroups_;  // [ranks]
  std::map<std::string, c10::intrusive_ptr<c10d::ProcessGroup>> role_groups_;          // [role]
  std::map<std::vector<int64_t>, c10::intrusive_ptr<c10d::ProcessGroup>> host_groups_;  // [ranks], not over Gloo
};

}  // namespace hetseq
