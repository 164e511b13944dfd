#include "hetseq/channel/group_channel.h"

#include "hetseq/core/error.h"
#include "hetseq/core/format.h"
#include "hetseq/world/lost_peer.h"
#include "hetseq/observe/tracer.h"

namespace hetseq {

GroupChannel::GroupChannel(c10::intrusive_ptr<c10d::ProcessGroup> group, c10::Device device, bool fast_stat_sync,
                           c10::intrusive_ptr<c10d::ProcessGroup> host_group)
    : host_(host_group ? host_group : group), stats_(group, device, fast_stat_sync, host_group) {
  rank_ = host_->getRank();
  world_size_ = host_->getSize();
}

void GroupChannel::start_update(const LogSums& local, const LogTensors& device_values, bool stop) {
  const TraceSpan span(tracer_.get(), "stat_start");
  stats_.start(local, device_values, StatSync::kUpdate, stop);  // travels during backward: Note [Stat sync]
}

UpdateAgreement GroupChannel::finish_update() {
  HETSEQ_ASSERT(stats_.started(), "finish_update without start_update");
  const TraceSpan span(tracer_.get(), "stat_sync");
  UpdateAgreement done;
  done.sums = stats_.finish();
  done.stop = stats_.last_stop_votes() > 0;
  done.late = stats_.take_late();
  done.host_reads = stats_.last_host_reads();
  return done;
}

std::vector<std::vector<double>> GroupChannel::gather(const std::vector<double>& local) {
  HETSEQ_ASSERT(!stats_.started(), "a gather while an update's statistics are in flight");
  const auto k = static_cast<int64_t>(local.size());
  // Every row carries its length first, so that rows of different lengths are an error, not a mix-up.
  std::vector<double> row{static_cast<double>(k)};
  row.insert(row.end(), local.begin(), local.end());
  const auto options = torch::TensorOptions().dtype(torch::kFloat64);
  std::vector<torch::Tensor> in{torch::tensor(row, options)};
  std::vector<std::vector<torch::Tensor>> out(1);
  for (int64_t r = 0; r < world_size_; ++r) out[0].push_back(torch::empty({k + 1}, options));
  wait_for_peers(host_->allgather(out, in), rank_, world_size_, fmt::format("allgather of {} per-rank figures", k));
  std::vector<std::vector<double>> all;
  for (int64_t r = 0; r < world_size_; ++r) {
    const double* p = out[0][static_cast<size_t>(r)].const_data_ptr<double>();
    if (p[0] != static_cast<double>(k)) {
      throw InputError(fmt::format("rank {} of {}: a gather of {} figures met rank {} with {}: the ranks reached "
                                   "different gathers",
                                   rank_, world_size_, k, r, p[0]));
    }
    all.emplace_back(p + 1, p + 1 + k);
  }
  return all;
}

}  // namespace hetseq
