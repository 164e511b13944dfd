// The Controller's device values read after the next update: Note [Reading an update late].
#include <cmath>

#include <c10/core/impl/VirtualGuardImpl.h>

#include "hetseq/core/error.h"
#include "hetseq/train/controller.h"
#include "hetseq/train/controller_detail.h"

namespace hetseq {

// Note [Reading an update late]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A host that reads a device value inside an update waits for the device to get there, and the device then
// idles while the host launches the rest of the update: on a GPU with small kernels most of the update's
// time. The host needs two kinds of device values:
// - the gradient norm, for clipping: the clip coefficient min(1, clip / (norm + 1e-6)), exactly where
//   norm > clip as before, is a device tensor that multiplies the gradients (one foreach call per device and
//   dtype); the norm is read only for the log.
// - the task's device statistics (losses, correct counts; Note [Statistics on the device]), for the log.
//   They stay on the device too: in a world of one no rank has to add them up; with several ranks the
//   channel's round sums them over the ranks on the device, in a collective of their own beside the host's
//   row (Note [Stat sync]), and hands them over as rows (LateSums) that the host adds in rank order when it
//   reads them. The round's host part (the sample count, the stop votes, which names the ranks report)
//   travels in host memory on a host group, so no read of the device is left in a steady-state update at
//   any number of ranks (tests/channel/test_host_reads.cpp counts them through the dispatcher).
// At the end of an update its late values (the statistics' rows, then the norm) are stacked into one float64
// tensor and copied without blocking into pinned host memory, with an event recorded after the copy; the
// host reads them at the end of the next update, when the device has long finished them, and adds them
// to the meters then. train_stats() (the log), meter_state() and state() (checkpoints) and the epoch's end
// read the last update at once. A norm that is not finite is the same error as before, one update later:
// the model is ruined either way, and no checkpoint is written after it, since state() reads first.
// Under --fp16 the host reads the norm at once: whether the update is skipped decides the update count,
// the learning rate and the loss scale of the next update on the host (Note [Loss scaling]).
void Controller::keep_late(UpdateResult result) {
  torch::NoGradGuard no_grad;
  PendingUpdate p;
  std::vector<torch::Tensor> values;  // float64 on the device: the statistics' rows, then the norm
  if (!late_sums_.empty()) values.push_back(late_sums_.rows.reshape({-1}));
  values.push_back(late_norm_.reshape({1}).to(torch::kFloat64));
  p.late = std::move(late_sums_);
  late_sums_ = LateSums();
  const torch::Tensor on_device = values.size() == 1 ? values.front() : torch::cat(values);
  const bool cuda = on_device.is_cuda();
  p.values = torch::empty({on_device.size(0)}, torch::TensorOptions().dtype(torch::kFloat64).pinned_memory(cuda));
  p.values.copy_(on_device, /*non_blocking=*/true);
  if (cuda) {
    const c10::impl::VirtualGuardImpl impl(on_device.device().type());
    p.copied = std::make_shared<c10::Event>(on_device.device().type());
    p.copied->record(impl.getStream(on_device.device()));
  }
  p.update = num_updates_;
  p.result = std::move(result);
  pending_ = std::move(p);
}

std::optional<UpdateResult> Controller::read_late_update() {
  if (!pending_) return std::nullopt;
  PendingUpdate p = std::move(*pending_);
  pending_.reset();
  if (p.copied) p.copied->synchronize();
  const double* values = p.values.const_data_ptr<double>();  // host memory, written by the copy
  p.late.add_totals(p.result.sums, values);
  const double gnorm = values[p.values.size(0) - 1];
  if (!std::isfinite(gnorm)) throw detail::diverged(p.update, gnorm);
  p.result.gnorm = gnorm;
  p.result.clipped = options_.clip_norm > 0 && gnorm > options_.clip_norm;
  p.result.late = false;
  update_meters(p.result);
  return std::move(p.result);
}

}  // namespace hetseq
