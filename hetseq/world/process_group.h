#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "hetseq/world/gloo_tls.h"

namespace hetseq {

/// Which collective backend a process group uses.
struct ProcessGroupOptions {
  std::string backend = "gloo";  // --distributed-backend: gloo (CPU tensors) or nccl (CUDA tensors)
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};  // --distributed-timeout, per collective
  /// The rendezvous host (tcp://, env://), when there is one: Gloo listens on the local address
  /// that routes to it. GLOO_SOCKET_IFNAME, when set, names the interface instead.
  std::string master_host;
  /// --debug-collectives: every collective is first checked across the ranks (operation, tensor sizes,
  /// dtypes, devices) by c10d's ProcessGroupWrapper over a second Gloo group, so that ranks that reach
  /// different collectives fail with an error naming the rank and the operation instead of hanging or
  /// reducing mismatched buffers. Costs a small allgather and a barrier per collective. The reducer's gradient
  /// buckets then stay on the group, never in shared memory (checks_collectives).
  bool debug_collectives = false;
  /// A backend to put in front of the group's Gloo or NCCL backend (under the --debug-collectives
  /// wrapper, whose checks run over a group of their own), given that backend; none when empty. The
  /// tests count the collectives the program asks for with one (tests/support/counting_backend.h).
  std::function<c10::intrusive_ptr<c10d::Backend>(c10::intrusive_ptr<c10d::Backend>)> wrap_backend;
  /// Gloo's pairs over mutual TLS with the job's identity (Note [Gloo over TLS]); none: plain TCP.
  std::shared_ptr<const GlooTls> tls;
};

/// A c10d process group of `world_size` ranks over `store`, with the chosen backend registered for
/// its device types (Gloo for CPU and, where LibTorch has CUDA, CUDA tensors; NCCL for CUDA). The
/// caller makes the rank's CUDA device current first (see World). Throws hetseq::UsageError
/// for an unknown or unavailable backend, hetseq::InputError when the backend cannot connect.
/// Turns c10d's flight recorder off unless TORCH_FR_BUFFER_SIZE (or TORCH_NCCL_TRACE_BUFFER_SIZE) asks
/// for it. Call it first thing in main(), before any thread starts: it sets an environment variable.
/// See Note [Flight recorder off].
void flight_recorder_off_by_default();

c10::intrusive_ptr<c10d::ProcessGroup> make_process_group(const c10::intrusive_ptr<c10d::Store>& store, int64_t rank,
                                                          int64_t world_size, const ProcessGroupOptions& options);

/// Whether `group`'s CPU collectives are checked across the ranks first (made with
/// ProcessGroupOptions::debug_collectives): the DistributedReducer then keeps its gradient buckets on the
/// group rather than in shared memory, where no check would see them (Note [Shared memory and
/// --debug-collectives], ddp_reducer.cpp).
bool checks_collectives(const c10::intrusive_ptr<c10d::ProcessGroup>& group);

}  // namespace hetseq
