#pragma once
/// The comm hooks of the gradient buckets, one class per --ddp-comm-hook (and one for the shared-memory
/// path): each sums a bucket over the ranks with no division by the world size, as Note [Comm hooks]
/// (bucket_hook.cpp) says. DistributedReducer registers one with its c10d::Reducer. Internal: not installed.

#include <functional>
#include <memory>
#include <string>

#include <ATen/core/ivalue.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/comm.hpp>

#include "hetseq/observe/tracer.h"
#include "hetseq/reduce/comm_clock.h"
#include "hetseq/reduce/comm_hook.h"

namespace hetseq {

class PowerSgd;
class SharedMemoryReduce;

/// What every bucket hook shares: the group it sums over (the run's, or the ranks that take part: Note
/// [Sitting out]), the clock of the update's reductions and their trace spans.
class BucketHook : public c10d::CppCommHookInterface<c10::intrusive_ptr<c10d::ProcessGroup>> {
 public:
  BucketHook(c10::intrusive_ptr<c10d::ProcessGroup> group, std::shared_ptr<detail::CommClock> clock);

  /// The group the buckets are summed over from now on. Called between updates.
  void set_group(c10::intrusive_ptr<c10d::ProcessGroup> group) { state_ = std::move(group); }

 protected:
  /// How a reduction started at `start` ends: the clock, the trace spans of bucket `index` (`bytes` on the wire,
  /// `on_device` the device row's span or null), and, for a failed `future`, a PeerError naming the rank, the
  /// bucket and `how` (what went on the wire, e.g. ", --ddp-comm-hook fp16"), or the future's own error where
  /// `how` is null. `finish` (may be empty) turns the reduced value into the bucket's.
  c10::intrusive_ptr<c10::ivalue::Future> complete(const c10::intrusive_ptr<c10::ivalue::Future>& future, int index,
                                                   int64_t bytes, detail::CommClock::Clock::time_point start,
                                                   const std::shared_ptr<Tracer>& tracer, Tracer::DeviceSpan* on_device,
                                                   const char* how,
                                                   std::function<c10::IValue(c10::ivalue::Future&)> finish);
  /// Starts the clock and the device span of bucket `index` of `bytes`; returns the tracer (null: none).
  std::shared_ptr<Tracer> launch(int index, int64_t bytes, bool device_span, Tracer::DeviceSpan** on_device);
  /// One bucket's reduction from start to end: launch(), then `start_reduction` (the future of the sum), then
  /// complete() with `how` and `finish`.
  c10::intrusive_ptr<c10::ivalue::Future> reduce(
      int index, int64_t bytes, bool device_span,
      const std::function<c10::intrusive_ptr<c10::ivalue::Future>()>& start_reduction, const char* how,
      std::function<c10::IValue(c10::ivalue::Future&)> finish = nullptr);

  std::shared_ptr<detail::CommClock> clock_;
};

/// What make_bucket_hook needs besides the group and the clock.
struct BucketHookOptions {
  CommHook kind = CommHook::kNone;
  std::function<double()> sample_size;     // the update's global sample count S (fp16, bf16)
  std::shared_ptr<PowerSgd> powersgd;       // kPowerSgd
  std::shared_ptr<SharedMemoryReduce> shm;  // --shared-memory-reduce: every bucket through it, whatever `kind`
};

/// The hook for `options`: SharedMemoryHook where `shm` is given, else by `kind`: SumHook, CastHook or
/// PowerSgdHook.
std::unique_ptr<BucketHook> make_bucket_hook(c10::intrusive_ptr<c10d::ProcessGroup> group,
                                             std::shared_ptr<detail::CommClock> clock, BucketHookOptions options);

/// none: the bucket allreduced as it is.
class SumHook final : public BucketHook {
 public:
  using BucketHook::BucketHook;
  c10::intrusive_ptr<c10::ivalue::Future> runHook(c10d::GradBucket& bucket) override;
};

/// fp16, bf16: divided by S, cast, allreduced, cast back and multiplied by S.
class CastHook final : public BucketHook {
 public:
  CastHook(c10::intrusive_ptr<c10d::ProcessGroup> group, std::shared_ptr<detail::CommClock> clock, CommHook kind,
           std::function<double()> sample_size);
  c10::intrusive_ptr<c10::ivalue::Future> runHook(c10d::GradBucket& bucket) override;

 private:
  CommHook kind_;
  std::function<double()> sample_size_;
  std::string how_;  // ", --ddp-comm-hook fp16" in a failed allreduce's message
};

/// powersgd: the bucket's low-rank approximation of the sum (Note [PowerSGD]).
class PowerSgdHook final : public BucketHook {
 public:
  PowerSgdHook(c10::intrusive_ptr<c10d::ProcessGroup> group, std::shared_ptr<detail::CommClock> clock,
               std::shared_ptr<PowerSgd> powersgd);
  c10::intrusive_ptr<c10::ivalue::Future> runHook(c10d::GradBucket& bucket) override;

 private:
  std::shared_ptr<PowerSgd> powersgd_;
};

/// --shared-memory-reduce: the bucket summed in a segment of shared memory on the reduction's own thread while
/// backward goes on, as the process group's allreduce would be (Note [Shared-memory reduction]); a PeerError
/// there comes out of backward() when the Reducer waits.
class SharedMemoryHook final : public BucketHook {
 public:
  SharedMemoryHook(c10::intrusive_ptr<c10d::ProcessGroup> group, std::shared_ptr<detail::CommClock> clock,
                   std::shared_ptr<SharedMemoryReduce> shm);
  c10::intrusive_ptr<c10::ivalue::Future> runHook(c10d::GradBucket& bucket) override;

 private:
  std::shared_ptr<SharedMemoryReduce> shm_;
};

}  // namespace hetseq
