#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/nn/module.h>

namespace hetseq {

/// What each rank tells the others at start. The ranks must agree on everything but their own batch
/// sizes, update frequencies, hosts and devices: see Note [Compared flags].
struct WorkerInfo {
  int64_t rank = 0;
  int64_t world_size = 1;
  std::string host;
  std::string device;
  std::string task;
  int64_t num_params = 0;
  std::string model_digest;            // parameter names and shapes (see model_digest)
  /// What every rank must have alike: each flag that is not per-rank, by long name, as text, plus
  /// facts the flags do not show (the resolved backend, each split's dataset size).
  std::map<std::string, std::string> compared;
  std::vector<int64_t> batch_size;     // [epoch] this rank's --max-sentences (one value today)
  std::vector<int64_t> update_freq;    // [epoch] this rank's --update-freq list
  int64_t valid_batch_size = 0;
  int64_t balance_cap = 0;             // --balance-cap: largest micro-batch when balancing (0: none)
  /// For the memory check (Note [Memory that a rank needs]): the bytes this rank offers (0: not checked),
  /// whether that is the free memory, and one forward and backward's peak bytes at `memory_micro_batch`.
  int64_t memory_budget = 0;
  bool memory_budget_is_free_memory = false;
  int64_t activation_bytes = 0;
  int64_t memory_micro_batch = 0;
};

/// A digest of the model's parameter and buffer names and shapes.
std::string model_digest(const torch::nn::Module& model);

/// Publishes `mine` in the store and reads every rank's info (each read waits up to `timeout`).
/// Checks that all ranks agree on world size, task, model and every compared entry; throws
/// hetseq::InputError naming the entry (the flag), two ranks and their two values. Returns the infos indexed by rank.
std::vector<WorkerInfo> exchange_worker_info(c10d::Store& store, const WorkerInfo& mine,
                                             std::chrono::milliseconds timeout);

/// Checks that every rank has the same `value` for `what` (e.g. the digest of the state restored from
/// a checkpoint) by exchanging it through the store under `key`. Throws hetseq::InputError naming the
/// ranks whose value differs from rank 0's, and `hint`, the likely cause.
void check_ranks_agree(c10d::Store& store, int64_t rank, int64_t world_size, const std::string& key,
                       const std::string& value, const std::string& what, const std::string& hint,
                       std::chrono::milliseconds timeout);

}  // namespace hetseq
