#include "hetseq/channel/collective_channel.h"

#include "hetseq/core/error.h"

namespace hetseq {

// Note [Communication roles]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~
// A distributed update talks to the other ranks through two parts that know nothing of each other, as
// c10d keeps its Reducer apart from the ProcessGroup's other collectives:
//  * the GradientReducer (DistributedReducer) moves gradients and nothing else: the buckets' allreduces
//    started from the backward hooks (Note [Bucketed reduction]), the buffer broadcast, the bucket layout
//    and the comm hook's state;
//  * the CollectiveChannel (GroupChannel) carries every other message, each with its own type: the
//    update's statistics with the stop vote (UpdateAgreement), a validation's sums, and gathers of
//    per-rank figures (the balancer's measurements and the rank summaries) as real allgathers.
// The Controller owns the update's exchange: it builds the statistics once, at the last micro-batch's
// backward, starts them on the channel before it arms the reducer (so the one statistics collective
// travels while backward runs, Note [Stat sync]), lets the reducer's comm hooks read the global sample
// count from the channel (Note [Comm hooks]), and after backward waits for the reducer and then for the
// channel. The training loop hands the Controller the stop vote and reads the agreement from the update's
// result; it holds neither part. So per update in the steady state the collectives beyond the gradient
// buckets are exactly one, the statistics (test_comm_hooks.cpp counts them through a counting backend); two
// where a rank is on a GPU: the host's row on the host group and the device's statistics on the device's
// (Note [Stat sync]), so that no rank's host waits for its device inside an update.

UpdateAgreement LocalChannel::finish_update() {
  HETSEQ_ASSERT(pending_.has_value(), "finish_update without start_update");
  UpdateAgreement done = std::move(*pending_);
  pending_.reset();
  if (!pending_tensors_.empty()) {
    // One row, on the device: its values are read after the next update (Note [Reading an update late]).
    std::vector<torch::Tensor> values;
    for (const auto& [name, value] : pending_tensors_) {
      done.late.names.push_back(name);
      values.push_back(value.detach().reshape({}).to(torch::kFloat64));
    }
    done.late.rows = torch::stack(values).reshape({1, static_cast<int64_t>(values.size())});
    pending_tensors_.clear();
  }
  return done;
}

}  // namespace hetseq
