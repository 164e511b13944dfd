#include "hetseq/reduce/bucket_hook.h"

#include <optional>
#include <stdexcept>
#include <string>
#include <utility>

#include "hetseq/core/error.h"
#include "hetseq/core/format.h"
#include "hetseq/core/logging.h"

namespace hetseq {

// Note [Comm hooks]
// ~~~~~~~~~~~~~~~~~
// Every bucket goes through one comm hook, which sums it over the ranks with no division by the world
// size (Note [Weighted averaging]); --ddp-comm-hook chooses how it travels.
//
// none (the default): the float32 bucket is allreduced as it is. The sum is exact up to float32
// addition, so the exact weighting and bit-exact resume hold.
//
// fp16, bf16: the bucket is divided by the update's global sample count S, cast to the low precision,
// allreduced, cast back and multiplied by S. Half the bytes go on the wire. S is known before the
// first bucket is ready, because the Controller starts the statistics on the CollectiveChannel before
// backward and hands the reducer the channel's count (Note [Stat sync], Note [Communication roles]); a
// reduction driven without statistics uses S = 1. Dividing by S makes the values that are cast the
// terms of the mean gradient, of the same size as what PyTorch's hooks cast (each rank's mean
// gradient over the world size), so that float16's range (6e-5 to 65504 in normal numbers) holds
// them whatever the batch sizes; the Controller divides by S again afterwards, so the only change to
// the update is rounding:
//   * each rank's term is rounded to the format (relative error 2^-11 for float16, 2^-8 for
//     bfloat16), and the ring's partial sums are rounded again at every hop, so that the summed
//     gradient carries a relative error of about (W - 1) units of the format's last place, and the
//     exact weighting holds only up to that rounding; a resumed run still matches the uninterrupted
//     one bit for bit, because the rounding is deterministic;
//   * float16 flushes terms below 6e-8 to zero and saturates above 65504 to infinity.
// With --fp16 the bucket holds the gradients times the loss scale, and it is unscaled only after the
// sum, in the Controller: a term that overflows float16 becomes infinite, the sum is infinite on every
// rank, and the update is skipped and the scale lowered, as for an overflow in backward (Note [Loss
// scaling]). So dynamic loss scaling also keeps the scaled gradients inside float16's range on the
// wire. Without loss scaling an overflow on the wire is an error naming the update (the Controller
// refuses a non-finite gradient), which says to use bf16 or --fp16.
//
// powersgd: see Note [PowerSGD] (powersgd.cpp). Checkpoints keep its state (error feedback, Q, the
// update count): see Note [PowerSGD in checkpoints] (powersgd_state.cpp).
//
// One class per hook (SumHook, CastHook, PowerSgdHook, and SharedMemoryHook for --shared-memory-reduce, which
// takes every bucket whatever the hook); c10d's own hooks do the same, but libtorch does not export their
// symbols. A failed or timed-out reduction becomes a hetseq::PeerError naming the rank and the bucket; the
// Reducer waits on the returned future at the end of backward, so the error comes out of backward().

BucketHook::BucketHook(c10::intrusive_ptr<c10d::ProcessGroup> group, std::shared_ptr<detail::CommClock> clock)
    : c10d::CppCommHookInterface<c10::intrusive_ptr<c10d::ProcessGroup>>(std::move(group)), clock_(std::move(clock)) {}

std::shared_ptr<Tracer> BucketHook::launch(int index, int64_t bytes, bool device_span, Tracer::DeviceSpan** on_device) {
  clock_->on_launch(bytes);
  // The callback holds the tracer, so that a bucket completing after an error has unwound the training
  // thread still finds it alive.
  std::shared_ptr<Tracer> tracer = clock_->current_tracer();
  // On CUDA the future completes at enqueue; the device row times the collective itself (Note [Tracing]).
  *on_device = tracer && device_span
                   ? tracer->begin_device_span("allreduce", kBucketTrack + kDeviceBucketOffset + index, index)
                   : nullptr;
  return tracer;
}

c10::intrusive_ptr<c10::ivalue::Future> BucketHook::reduce(
    int index, int64_t bytes, bool device_span,
    const std::function<c10::intrusive_ptr<c10::ivalue::Future>()>& start_reduction, const char* how,
    std::function<c10::IValue(c10::ivalue::Future&)> finish) {
  Tracer::DeviceSpan* on_device = nullptr;
  const auto tracer = launch(index, bytes, device_span, &on_device);
  const auto start = detail::CommClock::Clock::now();
  return complete(start_reduction(), index, bytes, start, tracer, on_device, how, std::move(finish));
}

c10::intrusive_ptr<c10::ivalue::Future> BucketHook::complete(
    const c10::intrusive_ptr<c10::ivalue::Future>& future, int index, int64_t bytes,
    detail::CommClock::Clock::time_point start, const std::shared_ptr<Tracer>& tracer, Tracer::DeviceSpan* on_device,
    const char* how, std::function<c10::IValue(c10::ivalue::Future&)> finish) {
  return future->then(
      [clock = clock_, rank = state_->getRank(), size = state_->getSize(), index, bytes, start, tracer, on_device,
       how = how ? std::optional<std::string>(how) : std::nullopt,
       finish = std::move(finish)](c10::ivalue::Future& done) -> c10::IValue {
        clock->on_done(start);
        if (done.hasError()) {
          if (!how) std::rethrow_exception(done.exception_ptr());
          throw PeerError(fmt::format(
              "rank {} of {}: the allreduce of gradient bucket {} ({} bytes{}) failed: {} (a peer died, fell behind "
              "past the process group's timeout, or ran a different number of backward passes)",
              rank, size, index, bytes, *how, done.tryRetrieveErrorMessage()));
        }
        if (tracer) {
          try {
            if (on_device) tracer->end_device_span(on_device);
            tracer->add_span("allreduce", kBucketTrack + index, start, detail::CommClock::Clock::now(), index, bytes);
          } catch (const std::exception& e) {  // a trace is never worth failing the reduction for
            log::warn("[trace] rank {}: bucket {} not traced: {}", rank, index, e.what());
          }
        }
        return finish ? finish(done) : done.value();
      },
      future->elementType());
}

std::unique_ptr<BucketHook> make_bucket_hook(c10::intrusive_ptr<c10d::ProcessGroup> group,
                                             std::shared_ptr<detail::CommClock> clock, BucketHookOptions options) {
  if (options.shm) return std::make_unique<SharedMemoryHook>(std::move(group), std::move(clock), std::move(options.shm));
  switch (options.kind) {
    case CommHook::kNone:
      return std::make_unique<SumHook>(std::move(group), std::move(clock));
    case CommHook::kFp16:
    case CommHook::kBf16:
      return std::make_unique<CastHook>(std::move(group), std::move(clock), options.kind,
                                        std::move(options.sample_size));
    case CommHook::kPowerSgd:
      return std::make_unique<PowerSgdHook>(std::move(group), std::move(clock), std::move(options.powersgd));
  }
  throw std::logic_error("make_bucket_hook: an unknown comm hook");
}

}  // namespace hetseq
