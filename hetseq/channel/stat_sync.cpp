#include "hetseq/channel/stat_sync.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <utility>

#include "hetseq/core/error.h"
#include "hetseq/core/format.h"
#include "hetseq/world/lost_peer.h"

namespace hetseq {
namespace {

// FNV-1a over the names, each followed by a NUL (a 1 for a statistic on the device, `device`) so that
// {"ab"} and {"a", "b"} differ, and so do ranks that report a name from different places.
uint32_t hash_names(const LogSums& sums, const LogTensors& device) {
  uint32_t h = 2166136261u;
  auto mix = [&h](unsigned char c) {
    h ^= c;
    h *= 16777619u;
  };
  for (const auto& [name, value] : sums) {
    for (unsigned char c : name) mix(c);
    mix(device.count(name) > 0 ? 1 : 0);
  }
  return h;
}

// Adds CPU tensors into `sums` by reading their memory: on the CPU the device is the host, and reading
// waits for nothing.
void add_cpu_values(LogSums& sums, const LogTensors& tensors) {
  for (const auto& [name, value] : tensors) {
    HETSEQ_ASSERT(value.is_cpu(), "the statistic '{}' is on {}, and the statistics channel has no host group",
                  name, value.device().str());
    const torch::Tensor v = value.detach().reshape({}).to(torch::kFloat64).contiguous();
    sums[name] += *v.const_data_ptr<double>();
  }
}

std::vector<std::string> names_of(const LogSums& sums) {
  std::vector<std::string> names;
  for (const auto& [name, value] : sums) names.push_back(name);
  return names;
}

// Serialised LogSums: per entry a uint32 name length, the name's bytes, the value as 8 raw bytes.
std::vector<uint8_t> serialise(const LogSums& sums) {
  std::vector<uint8_t> out;
  for (const auto& [name, value] : sums) {
    const auto length = static_cast<uint32_t>(name.size());
    const size_t at = out.size();
    out.resize(at + sizeof(length) + name.size() + sizeof(value));
    std::memcpy(out.data() + at, &length, sizeof(length));
    std::memcpy(out.data() + at + sizeof(length), name.data(), name.size());
    std::memcpy(out.data() + at + sizeof(length) + name.size(), &value, sizeof(value));
  }
  return out;
}

LogSums deserialise(const uint8_t* data, size_t size, int64_t from_rank) {
  LogSums sums;
  size_t at = 0;
  while (at < size) {
    uint32_t length = 0;
    HETSEQ_ASSERT(at + sizeof(length) <= size, "stat sync: truncated entry from rank {}", from_rank);
    std::memcpy(&length, data + at, sizeof(length));
    at += sizeof(length);
    HETSEQ_ASSERT(at + length + sizeof(double) <= size, "stat sync: truncated entry from rank {}", from_rank);
    std::string name(reinterpret_cast<const char*>(data + at), length);
    at += length;
    double value = 0;
    std::memcpy(&value, data + at, sizeof(value));
    at += sizeof(value);
    sums[name] = value;
  }
  return sums;
}

}  // namespace

// Note [Stat sync]
// ~~~~~~~~~~~~~~~~
// The sums of an update (loss, nll_loss, ntokens, sample_size, ...) are added over the ranks with one
// collective that the Controller starts before the update's last backward (start()), as soon as the
// task has computed its last micro-batch's loss and statistics, so that it runs while backward
// computes and the gradient buckets are reduced; finish() after backward then only collects a result
// that is already there. The global sample count S travels in a slot of its own, valid whatever the
// names, so that the comm hooks can read it during backward (sample_size(); see Note [Comm hooks]).
// No statistics round trip is left after backward in the steady state: last_extra_rounds() counts
// the ones that remain, and a test holds it at 0. A collective needs the same size on every rank, and
// a rank cannot know the others' names, so every layout is cut for the number n of names that all
// ranks reported the last time they agreed (0 before the first call); a rank that reports another
// count sends zeros in place of its values, and the collective tells every rank so. The updates keep
// their n apart from the other sums (validation, the per-rank summary's gathers: Channel), so that
// those do not cost the next update a round. V (V_r) is the rank's vote to stop the run after this
// update (Note [Clean stops]): 0 or 1, summed like the count, so every rank learns the number of votes
// from the first collective whatever the names.
//
// Fast (--fast-stat-sync): one allreduce(SUM) of a float64 tensor
//     [ v_0 .. v_{n-1} | h_0 c_0 | h_1 c_1 | ... | h_{W-1} c_{W-1} | S | V ]
// where the v are the values in the order of their sorted names, and rank r writes the 32-bit hash
// h_r of its names and their count c_r into its own pair of slots (zeros elsewhere). Integers below
// 2^53 add exactly in float64, so every rank ends up with every rank's (h, c), and every rank takes
// the same branch:
//  * the pairs differ only in that some ranks report no statistic at all (a rank without samples,
//    e.g. without a validation batch when the split is smaller than the ranks' batches): every rank
//    sums the serialised statistics (below), which gives those ranks the names too;
//  * otherwise, when the pairs differ across ranks: every rank throws the same error, naming the
//    ranks, instead of adding up values that belong to different names;
//  * they agree and their count is n: the values are the sums (the one-allreduce steady state);
//  * they agree on another count (the first call, or all ranks switched names together, as between
//    training and validation): every rank now knows the new n and sends its values again at that
//    size. So a change of names costs one more small allreduce.
//
// Gathered (the default): one allgather of a float64 row per rank, [ s_r | h_r | c_r | V_r | v_0 .. v_{n-1} ].
// When every rank sent the same (h, c) with c = n, each rank keeps every rank's values (for per-rank
// logging) and adds them in rank order, so that every rank gets bitwise the same totals. Otherwise
// (the names changed, or differ between ranks) every rank falls back to the serialised sums: an
// allgather of the byte length of every rank's serialised sums, then an allgather of the serialised
// sums padded to the longest; a name missing on a rank counts as 0 there, the totals are added in
// rank order as above, and when all ranks reported the same names their count becomes the new n.
//
// The device's statistics (the task's LogTensors: losses, correct counts) and the host's. On the CPU the
// device is the host: its statistics are read at no wait and go into the row like the others. On a GPU a
// host that read them at the last backward would wait there for the device to finish the forward passes,
// and one that read the row of an NCCL collective would wait for the device again: so with a host group
// (StatSync's `host_group`: Gloo, on the host) the row above travels on the host group, in host memory,
// and names every statistic, a device statistic with a zero in its slot (the hash marks it as the
// device's, so that ranks that report a name from different places do not agree); the device's values,
// d_0 .. d_{m-1} in the order of their names, go in a second collective on the device's group, started
// right after the first and cut for the number m of device statistics agreed with n: one allreduce of
// the m values (fast) or one allgather of every rank's m values (gathered). When the host's row shows
// the layout in force (the steady state), the host never reads the device's collective: finish() leaves
// the device statistics out of its sums and hands them over as LateSums, rows still on the device, which
// the Controller copies without blocking and adds after the next update (Note [Reading an update late]),
// in rank order as above. A name that a rank reports both on the host and on the device travels on the
// device with the host's value added there (h + d per rank, as the host would have added them), its host
// slot 0. Where the names changed (the first update, a rank without samples), every rank learns it from the
// host's row at the same point, inside the update, reads its device values there (once, counted in
// last_host_reads()) and takes the paths above; the layout changes only where every rank reported the same
// names from the same places. So in the steady state the host waits for no device value, at any number of
// ranks, and learns the sample count and the stop votes from the host's row alone (over NCCL; where the
// device's group is Gloo, Gloo's wait for the device's collective blocks the host until the values reach
// it, as its gradient buckets do for the whole backward).

StatSync::StatSync(c10::intrusive_ptr<c10d::ProcessGroup> group, c10::Device device, bool fast,
                   c10::intrusive_ptr<c10d::ProcessGroup> host_group)
    : group_(std::move(group)), split_(host_group != nullptr), device_(device), fast_(fast) {
  HETSEQ_ASSERT(group_, "StatSync built without a process group");
  host_ = split_ ? std::move(host_group) : group_;
  rank_ = group_->getRank();
  world_size_ = group_->getSize();
  HETSEQ_ASSERT(split_ || device_.is_cpu(), "StatSync on {} without a host group: the host would wait for the device",
                device_.str());
  HETSEQ_ASSERT(host_->getRank() == rank_ && host_->getSize() == world_size_,
                "StatSync: the host group (rank {} of {}) is not the group's ranks (rank {} of {})", host_->getRank(),
                host_->getSize(), rank_, world_size_);
}

LogSums StatSync::sum(const LogSums& local, Channel channel) {
  start(local, channel);
  return finish();
}

void StatSync::wait(const c10::intrusive_ptr<c10d::Work>& work, const char* what) const {
  wait_for_peers(work, rank_, world_size_, fmt::format("{} of the statistics", what));
}

void StatSync::start(const LogSums& local, const LogTensors& device_values, Channel channel, bool stop) {
  HETSEQ_ASSERT(!pending_, "StatSync::start while the previous sum is not finished");
  extra_rounds_ = 0;
  host_reads_ = 0;
  stop_votes_ = 0;
  late_ = LateSums();
  if (split_) {
    launch(local, device_values, channel, agreed_count_[channel], agreed_device_count_[channel], stop);
  } else {
    LogSums all = local;
    add_cpu_values(all, device_values);
    launch(all, {}, channel, agreed_count_[channel], 0, stop);
  }
}

void StatSync::launch(const LogSums& local, const LogTensors& device, Channel channel, int64_t count,
                      int64_t device_count, bool stop) {
  // The host's row names every statistic; a device statistic's slot holds a zero (its value travels apart,
  // the host's value of the same name with it).
  Pending p;
  p.named = local;
  for (const auto& [name, value] : device) p.named[name] = 0.0;
  const LogSums& named = p.named;
  const int64_t n = static_cast<int64_t>(named.size());
  const double hash = static_cast<double>(hash_names(named, device));
  const double sample_size = sum_or(local, "sample_size");
  p.local = local;
  p.device = device;
  p.channel = channel;
  p.count = count;
  p.device_count = device_count;
  p.stop = stop;
  p.fits = n == count && static_cast<int64_t>(device.size()) == device_count;
  const bool fits = p.fits;
  torch::Tensor row;
  if (fast_) {
    row = torch::zeros({count + 2 * world_size_ + 2}, torch::TensorOptions().dtype(torch::kFloat64));
    auto a = row.accessor<double, 1>();
    if (fits) {
      int64_t i = 0;
      for (const auto& [name, value] : named) a[i++] = value;
    }
    a[count + 2 * rank_] = hash;
    a[count + 2 * rank_ + 1] = static_cast<double>(n);
    a[count + 2 * world_size_] = sample_size;
    a[count + 2 * world_size_ + 1] = stop ? 1.0 : 0.0;
  } else {
    row = torch::zeros({4 + count}, torch::TensorOptions().dtype(torch::kFloat64));
    auto a = row.accessor<double, 1>();
    a[0] = sample_size;
    a[1] = hash;
    a[2] = static_cast<double>(n);
    a[3] = stop ? 1.0 : 0.0;
    if (fits) {
      int64_t i = 4;
      for (const auto& [name, value] : named) a[i++] = value;
    }
  }
  p.in.push_back(row);  // host memory: the host group is Gloo's, and the group's device is the CPU without one
  if (fast_) {
    p.work = host_->allreduce(p.in);
  } else {
    p.out.resize(1);
    for (int64_t r = 0; r < world_size_; ++r) p.out[0].push_back(torch::empty_like(p.in[0]));
    p.work = host_->allgather(p.out, p.in);
  }
  if (device_count > 0) {
    // The device's row, cut for the agreed count too: a rank that reports another count sends zeros, and the
    // host's row tells every rank so (see Note [Stat sync]).
    torch::Tensor values;
    if (static_cast<int64_t>(device.size()) == device_count) {
      // A name the host reports too travels here with the host's value added (on the device), so that the
      // ranks add h + d per rank as they would have on the host, and its slot in the host's row stays 0.
      std::vector<torch::Tensor> parts;
      for (const auto& [name, value] : device) {
        torch::Tensor v = value.detach().reshape({}).to(torch::kFloat64);
        if (const auto it = local.find(name); it != local.end()) v = v + it->second;
        parts.push_back(v);
      }
      values = torch::stack(parts);
    } else {
      values = torch::zeros({device_count}, torch::TensorOptions().dtype(torch::kFloat64).device(device_));
    }
    p.device_in.push_back(values);
    if (fast_) {
      p.device_work = group_->allreduce(p.device_in);
    } else {
      p.device_out.resize(1);
      for (int64_t r = 0; r < world_size_; ++r) p.device_out[0].push_back(torch::empty_like(values));
      p.device_work = group_->allgather(p.device_out, p.device_in);
    }
  }
  pending_ = std::move(p);
  rows_.clear();
}

const std::vector<torch::Tensor>& StatSync::rows() {
  HETSEQ_ASSERT(pending_, "StatSync: no sum was started");
  if (!pending_->waited) {
    wait(pending_->work, fast_ ? "allreduce (--fast-stat-sync)" : "allgather");
    pending_->waited = true;
    rows_ = fast_ ? pending_->in : pending_->out[0];  // host memory: read in place
    stop_votes_ = 0;
    for (const auto& row : rows_) {
      const auto a = row.accessor<double, 1>();
      stop_votes_ += static_cast<int64_t>(fast_ ? a[pending_->count + 2 * world_size_ + 1] : a[3]);
    }
  }
  return rows_;
}

void StatSync::wait_device() {
  if (!pending_->device_work) return;
  wait(pending_->device_work, fast_ ? "allreduce of the device's part (--fast-stat-sync)" : "allgather of the device's part");
  pending_->device_work.reset();
}

void StatSync::keep_device_late(LogSums& total) {
  if (pending_->device.empty()) return;
  // NCCL: the current stream waits for the collective's, the host does not. Gloo on CUDA tensors (a GPU rank
  // beside CPU ranks, --distributed-backend gloo): the host waits until the values reached it, as Gloo's
  // gradient buckets make it wait for the whole backward anyway.
  wait_device();
  for (const auto& [name, value] : pending_->device) {
    late_.names.push_back(name);
    total.erase(name);  // its zeros; the host's value, if any, went with the device's
    for (LogSums& sums : per_rank_) sums.erase(name);
  }
  late_.rows = fast_ ? pending_->device_in[0].reshape({1, pending_->device_count}) : torch::stack(pending_->device_out[0]);
}

LogSums StatSync::read_all() {
  LogSums all = pending_->local;
  if (add_to_host(all, pending_->device)) ++host_reads_;  // names changed: read once, here
  return all;
}

double StatSync::sample_size() {
  const std::vector<torch::Tensor>& r = rows();
  if (fast_) return r[0].accessor<double, 1>()[pending_->count + 2 * world_size_];
  double total = 0;
  for (const auto& row : r) total += row.accessor<double, 1>()[0];
  return total;
}

LogSums StatSync::finish() {
  HETSEQ_ASSERT(pending_, "StatSync::finish without start");
  struct Clear {  // the sum is over, however it ends
    std::optional<Pending>& pending;
    ~Clear() { pending.reset(); }
  } clear{pending_};
  return fast_ ? finish_fast() : finish_gathered();
}

LogSums StatSync::finish_fast() {
  per_rank_.clear();
  // Copies: a second round replaces the pending sum.
  const LogSums local = pending_->local;
  const LogTensors device = pending_->device;
  const LogSums named = pending_->named;
  const int64_t n = static_cast<int64_t>(named.size());

  // The [W] pairs (hash, count) of every rank, from a summed buffer in which each rank filled its own.
  auto read_pairs = [&](const torch::Tensor& summed, int64_t offset) {
    std::vector<std::pair<uint32_t, int64_t>> pairs;  // [rank]
    auto a = summed.accessor<double, 1>();
    for (int64_t r = 0; r < world_size_; ++r) {
      pairs.emplace_back(static_cast<uint32_t>(a[offset + 2 * r]), static_cast<int64_t>(a[offset + 2 * r + 1]));
    }
    return pairs;
  };
  // Whether the ranks agree (false), or only ranks without any statistic (no samples, e.g. no
  // validation batch) differ from the others, which agree (true: the union is gathered instead, so
  // that those ranks learn the names too). Any other disagreement is an error.
  auto check_pairs = [&](const std::vector<std::pair<uint32_t, int64_t>>& pairs) {
    if (std::all_of(pairs.begin(), pairs.end(), [&](const auto& p) { return p == pairs[0]; })) return false;
    std::vector<std::pair<uint32_t, int64_t>> reporting;
    for (const auto& p : pairs) {
      if (p.second != 0) reporting.push_back(p);
    }
    if (std::all_of(reporting.begin(), reporting.end(), [&](const auto& p) { return p == reporting[0]; })) return true;
    std::map<std::pair<uint32_t, int64_t>, std::vector<int64_t>> groups;  // [(hash, count)] ranks
    for (int64_t r = 0; r < world_size_; ++r) groups[pairs[r]].push_back(r);
    std::vector<std::string> parts;
    for (const auto& [pair, ranks] : groups) {
      parts.push_back(fmt::format("ranks [{}] report {} names (hash {:08x})", fmt::join(ranks, ", "), pair.second,
                                  pair.first));
    }
    throw InputError(fmt::format(
        "--fast-stat-sync: the ranks report different statistics: {}; this rank ({}) reports [{}]. With "
        "--fast-stat-sync every rank must report the same names; run without it to sum the union of the names",
        fmt::join(parts, "; "), rank_, fmt::join(names_of(named), ", ")));
  };

  // See Note [Stat sync]: at most two rounds, the second only when every rank's names changed to a
  // different count.
  for (;;) {
    const int64_t count = pending_->count;
    const torch::Tensor summed = rows()[0];
    if (check_pairs(read_pairs(summed, count))) {
      wait_device();
      extra_rounds_ += 2;
      return sum_serialised(read_all());
    }
    if (!pending_->fits) {
      // Every rank has these names now: send the values again at their size.
      agreed_count_[pending_->channel] = n;
      agreed_device_count_[pending_->channel] = static_cast<int64_t>(device.size());
      wait_device();
      ++extra_rounds_;
      launch(local, device, pending_->channel, n, static_cast<int64_t>(device.size()), pending_->stop);
      continue;
    }
    LogSums total;
    auto a = summed.accessor<double, 1>();
    int64_t i = 0;
    for (const auto& [name, value] : named) total[name] = a[i++];
    keep_device_late(total);
    return total;
  }
}

LogSums StatSync::finish_gathered() {
  const LogSums& named = pending_->named;
  const std::vector<torch::Tensor>& r = rows();
  const auto mine = r[static_cast<size_t>(rank_)].accessor<double, 1>();
  // Every rank reported the same names from the same places (hash and count).
  const bool same_places = std::all_of(r.begin(), r.end(), [&](const torch::Tensor& row) {
    const auto a = row.accessor<double, 1>();
    return a[1] == mine[1] && a[2] == mine[2];
  });
  if (!(pending_->fits && same_places)) {
    wait_device();
    extra_rounds_ += 2;
    LogSums total = sum_serialised(read_all());
    const std::vector<std::string> names = names_of(per_rank_[0]);
    // The layout changes only where the places agree too: the device's counts must agree, or the next update's
    // collectives would differ in size.
    if (same_places &&
        std::all_of(per_rank_.begin(), per_rank_.end(), [&](const LogSums& s) { return names_of(s) == names; })) {
      agreed_count_[pending_->channel] = static_cast<int64_t>(names.size());
      agreed_device_count_[pending_->channel] = static_cast<int64_t>(pending_->device.size());
    }
    return total;
  }
  per_rank_.clear();
  LogSums total;
  for (const torch::Tensor& row : r) {
    const auto a = row.accessor<double, 1>();
    LogSums sums;
    int64_t i = 4;
    for (const auto& [name, value] : named) sums[name] = a[i++];
    for (const auto& [name, value] : sums) total[name] += value;
    per_rank_.push_back(std::move(sums));
  }
  keep_device_late(total);
  return total;
}

LogSums StatSync::sum_serialised(const LogSums& local) {
  const std::vector<uint8_t> bytes = serialise(local);

  // On the host's group, in host memory, as the rows.
  std::vector<torch::Tensor> length_in{
      torch::full({1}, static_cast<int64_t>(bytes.size()), torch::TensorOptions().dtype(torch::kInt64))};
  std::vector<std::vector<torch::Tensor>> length_out(1);
  for (int64_t r = 0; r < world_size_; ++r) length_out[0].push_back(torch::empty_like(length_in[0]));
  wait(host_->allgather(length_out, length_in), "allgather of the lengths");
  std::vector<int64_t> lengths;  // [rank] bytes
  for (const auto& t : length_out[0]) lengths.push_back(*t.const_data_ptr<int64_t>());
  const int64_t longest = std::max<int64_t>(1, *std::max_element(lengths.begin(), lengths.end()));

  torch::Tensor padded = torch::zeros({longest}, torch::TensorOptions().dtype(torch::kUInt8));
  if (!bytes.empty()) std::memcpy(padded.data_ptr<uint8_t>(), bytes.data(), bytes.size());
  std::vector<torch::Tensor> data_in{padded};
  std::vector<std::vector<torch::Tensor>> data_out(1);
  for (int64_t r = 0; r < world_size_; ++r) data_out[0].push_back(torch::empty_like(data_in[0]));
  wait(host_->allgather(data_out, data_in), "allgather");

  per_rank_.clear();
  LogSums total;
  for (int64_t r = 0; r < world_size_; ++r) {
    const torch::Tensor received = data_out[0][r].contiguous();
    per_rank_.push_back(deserialise(received.data_ptr<uint8_t>(), static_cast<size_t>(lengths[r]), r));
    for (const auto& [name, value] : per_rank_.back()) total[name] += value;
  }
  return total;
}

}  // namespace hetseq
