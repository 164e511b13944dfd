#include "hetseq/shard/unit_gather.h"

#include <algorithm>
#include <map>

#include <zlib.h>

#include "hetseq/core/error.h"
#include "hetseq/core/format.h"
#include "hetseq/world/lost_peer.h"

namespace hetseq {

// Note [Sharded parameters]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// Under --zero-sharding full a rank keeps, between passes, only its shard of the parameters: the elements
// [first_r, first_r + numel_r) of the flat space of Note [Sharded optimizer state], cut in proportion to the
// memory budgets (UnitGather::shard(), which the optimizer steps in place), besides its shard of the gradients
// (Note [Sharded gradients]) and of the optimizer state.
//
// Units. A model names its units (ShardableModel::units(): BERT's encoder layers; MNIST's convolutions, fc1 and
// fc2) and runs each through the UnitRunner (run_unit). Every parameter becomes a view of its unit's flat buffer
// (the unit's parameters end to end, in the flat space's order); the buffer's storage is emptied between passes
// and refilled in place by the gather, so that whatever autograd saved of a parameter (the tensor itself, or a
// transposed view of it: the same storage object) reads the gathered values in backward. Refilling writes the
// buffer, not the parameters, so no saved tensor's version changes. The parameters of no unit, the root
// (embeddings, heads, a weight tied between them), stay whole on every rank: after each step the root's updated
// shards are gathered to every rank (gather_root), as --zero-sharding os gathers every parameter.
//
// A unit's pass. Forward: gather unit u (or wait for its prefetch), launch unit u + 1's gather, run the unit,
// free it, and hook the unit's output. Backward: the output's hook fires before any of the unit's backward nodes
// (they all lie behind its output), gathers u again (or waits for it) and launches u - 1's; hooks on the unit's
// parameters' gradient accumulators count them, and the last frees the unit: by then every node that reads a
// parameter has run, since a parameter's accumulator runs after every node that differentiates through it. So a
// rank holds at most two units besides the root. A gather is one broadcast per owner of a piece of the unit (a
// unit small beside the shards has one or two), into the unit's buffer, so the uneven shards need no padding.
//
// The same gathers on every rank. c10d matches collectives by their order, and the gathers run on a process
// group of their own (World::role_group), so they never interleave with the gradient buckets' gathers on the
// world's group, which the accumulators' hooks launch in the same backward. Every rank must launch the same
// gathers in the same order, and the launches of a pass follow from the units alone: forward 0, 1, ..., U - 1,
// backward U - 1, ..., 0 (a model runs its units in order, each once a forward; run() checks). A rank with no
// samples for a pass (an empty micro-batch at an epoch's uneven end, a smaller --update-freq, fewer validation
// batches) runs a stand-in: samples of the data, the loss times 0 (Note [Stand-in passes], the Validator), so that
// its gathers, and the gradient buckets' order, are those of the ranks that compute; its generator states and
// buffers are restored after, so its dropout draws and statistics stay those of --zero-sharding none.
//
// A branch. A parameter that gets no gradient in a pass on some ranks (a branch that the data decides) leaves its
// unit gathered after that rank's backward: its accumulator, the last frees the unit, never runs. Left so, the
// next pass would find the unit gathered and skip a gather that the other ranks launch, and the gathers would
// no longer match (Gloo: "Received data size doesn't match expected size"). So a pass's first unit frees every
// unit still held before it gathers (release_all), and so does the update's end; the gradient that did not come
// counts as zeros in its bucket (ShardReducer::finish_update), as under os+grad. Exact, at the cost of holding
// such a unit until the next pass (tests/shard/test_zero_sharding.cpp, the branch_units task).
//
// The resume check. At start, the ranks compare a digest of their training state (the same checkpoint
// everywhere). Under full the live parameters cannot show a difference: a rank restores only its shard, so ranks
// given different checkpoints gather one mixed model, the same on every rank. So each rank takes the CRC of the
// whole model as it restored (or built) it, before it is sharded (TrainSession), and the check compares that
// too (the test: ranks resumed from two runs at the same update). The live state's digest needs the model's
// values as well: each rank gathers the units one at a time, as a pass does, and keeps each parameter's CRC-32
// (parameter_digests), never a whole copy, so that the check holds no more than a pass and the memory check has
// nothing more to count. Only a save gathers the whole model, kept on rank 0 (MemoryNeed::checkpoint_copy).
//
// Exact. The gathered values are the owners' shards, unchanged; the forward and backward passes compute what they
// compute under none, on the same values; the gradients are summed as under os+grad, and the step is elementwise.
// So on one machine the weights after k updates are none's bit for bit (tests/shard/test_zero_sharding.cpp).

namespace {

c10d::ProcessGroup& checked(const c10::intrusive_ptr<c10d::ProcessGroup>& group) {
  HETSEQ_ASSERT(group, "UnitGather without a process group");
  return *group;
}

}  // namespace

std::vector<int64_t> parameter_units(torch::nn::Module& model) {
  const auto named = model.named_parameters(/*recurse=*/true);
  std::vector<int64_t> out(named.size(), -1);
  auto* shardable = dynamic_cast<ShardableModel*>(&model);
  if (!shardable) return out;
  std::map<const c10::TensorImpl*, size_t> index;  // the parameter's place
  for (size_t p = 0; p < named.size(); ++p) index[named[p].value().unsafeGetTensorImpl()] = p;
  const auto units = shardable->units();
  for (size_t u = 0; u < units.size(); ++u) {
    for (const auto& t : units[u]->parameters(/*recurse=*/true)) {
      const auto it = index.find(t.unsafeGetTensorImpl());
      if (it == index.end()) continue;  // not the model's (a unit outside it): it cannot be sharded
      int64_t& unit = out[it->second];
      if (unit >= 0 && unit != static_cast<int64_t>(u)) {
        throw InternalError(fmt::format("--zero-sharding full: parameter {} is in units {} and {}; a parameter used by "
                                        "two units belongs to neither (leave it out of both)",
                                        named[it->second].key(), unit, u));
      }
      unit = static_cast<int64_t>(u);
    }
  }
  return out;
}

UnitSizes unit_sizes(const std::vector<torch::Tensor>& params, const std::vector<int64_t>& unit_of) {
  HETSEQ_ASSERT(params.size() == unit_of.size(), "unit_sizes of {} parameters with {} unit indices", params.size(),
                unit_of.size());
  std::map<int64_t, int64_t> numel;  // [unit]
  UnitSizes sizes;
  for (size_t p = 0; p < params.size(); ++p) {
    if (unit_of[p] < 0) {
      sizes.root += params[p].numel();
    } else {
      numel[unit_of[p]] += params[p].numel();
    }
  }
  sizes.units = static_cast<int64_t>(numel.size());
  for (const auto& [u, n] : numel) sizes.largest = std::max(sizes.largest, n);
  return sizes;
}

UnitGather::UnitGather(std::vector<torch::Tensor> params, const std::vector<int64_t>& unit_of,
                       std::vector<ShardRange> plan, c10::intrusive_ptr<c10d::ProcessGroup> group)
    : params_(std::move(params)), plan_(std::move(plan)), group_(std::move(group)), rank_(checked(group_).getRank()) {
  HETSEQ_ASSERT(!params_.empty() && unit_of.size() == params_.size() &&
                    static_cast<int64_t>(plan_.size()) == group_->getSize(),
                "UnitGather with {} parameters, {} unit indices and a plan of {} ranks for {}", params_.size(),
                unit_of.size(), plan_.size(), group_->getSize());
  int64_t num_units = 0;
  for (int64_t u : unit_of) num_units = std::max(num_units, u + 1);
  units_.resize(static_cast<size_t>(num_units) + 1);
  const size_t root = units_.size() - 1;
  const auto options = params_.front().options().requires_grad(false);
  std::vector<int64_t> numels;
  int64_t first = 0;
  size_t previous = units_.size();
  for (size_t p = 0; p < params_.size(); ++p) {
    const torch::Tensor& t = params_[p];
    HETSEQ_ASSERT(t.is_contiguous() && t.scalar_type() == params_[0].scalar_type() && t.device() == params_[0].device(),
                  "sharded parameter {} must be contiguous with parameter 0's dtype and device", p);
    const size_t u = unit_of[p] < 0 ? root : static_cast<size_t>(unit_of[p]);
    Unit& unit = units_[u];
    unit.params.push_back(p);
    if (t.numel() > 0) {
      if (u == previous && !unit.intervals.empty()) {
        unit.intervals.back().numel += t.numel();
      } else {
        unit.intervals.push_back(Interval{first, t.numel(), unit.numel});
      }
      previous = u;
    }
    unit.numel += t.numel();
    numels.push_back(t.numel());
    first += t.numel();
  }
  torch::NoGradGuard no_grad;
  // This rank's shard, from the parameters as they are (the same on every rank).
  const ShardRange mine = plan_[static_cast<size_t>(rank_)];
  shard_ = torch::empty({mine.numel}, options);
  int64_t at = 0;
  for (const ShardSlice& s : shard_slices(numels, mine)) {
    shard_.narrow(0, at, s.numel).copy_(params_[s.param].detach().reshape({-1}).narrow(0, s.offset, s.numel));
    at += s.numel;
  }
  // Every parameter a view of its unit's buffer.
  for (Unit& unit : units_) {
    unit.flat = torch::empty({unit.numel}, options);
    int64_t offset = 0;
    for (size_t p : unit.params) {
      torch::Tensor& t = params_[p];
      torch::Tensor view = unit.flat.narrow(0, offset, t.numel());
      view.copy_(t.detach().reshape({-1}));
      t.set_data(view.view(t.sizes()));
      offset += t.numel();
    }
  }
  units_[root].state = State::kPresent;
  for (size_t u = 0; u < root; ++u) {
    free(units_[u]);
    for (size_t p : units_[u].params) {
      if (!params_[p].requires_grad()) continue;
      hooks_.add(params_[p], [this, u] { on_gradient(u); }, fmt::format("parameter {}", p));
    }
  }
}

UnitGather::~UnitGather() {
  for (Unit& u : units_) {
    for (auto& w : u.works) {
      try {
        w->wait();
      } catch (...) {  // a pass that failed: its error has been reported
      }
    }
  }
}

int64_t UnitGather::held_bytes() const {
  // Read from the storages: a unit left gathered counts.
  int64_t bytes = static_cast<int64_t>(shard_.nbytes());
  for (const Unit& u : units_) bytes += static_cast<int64_t>(u.flat.storage().nbytes());
  return bytes;
}

void UnitGather::allocate(Unit& u) {
  c10::StorageImpl* storage = u.flat.storage().unsafeGetStorageImpl();
  const size_t bytes = static_cast<size_t>(u.numel) * u.flat.element_size();
  if (storage->nbytes() == bytes) return;
  storage->set_data_ptr_noswap(storage->allocator()->allocate(bytes));
  storage->set_nbytes(bytes);
}

void UnitGather::free(Unit& u) {
  c10::StorageImpl* storage = u.flat.storage().unsafeGetStorageImpl();
  storage->set_data_ptr_noswap(at::DataPtr(nullptr, u.flat.device()));
  storage->set_nbytes(0);
  u.state = State::kFree;
}

void UnitGather::launch(size_t index) {
  torch::NoGradGuard no_grad;
  Unit& u = units_[index];
  allocate(u);
  const ShardRange mine = plan_[static_cast<size_t>(rank_)];
  for (const Interval& iv : u.intervals) {
    for (size_t r = 0; r < plan_.size(); ++r) {
      const int64_t lo = std::max(iv.first, plan_[r].first);
      const int64_t hi = std::min(iv.first + iv.numel, plan_[r].first + plan_[r].numel);
      if (lo >= hi) continue;
      torch::Tensor piece = u.flat.narrow(0, iv.offset + lo - iv.first, hi - lo);
      if (static_cast<int64_t>(r) == rank_) piece.copy_(shard_.narrow(0, lo - mine.first, hi - lo));
      std::vector<torch::Tensor> tensors{piece};
      c10d::BroadcastOptions options;
      options.rootRank = static_cast<int64_t>(r);
      u.works.push_back(group_->broadcast(tensors, options));
    }
  }
  u.state = State::kPending;
}

void UnitGather::wait(size_t index) {
  Unit& u = units_[index];
  const std::string what = index + 1 == units_.size() ? std::string("gather of the root's parameters after the update")
                                                      : fmt::format("gather of unit {}'s parameters", index);
  for (auto& w : u.works) wait_for_peers(w, rank_, group_->getSize(), what);
  u.works.clear();
  u.state = State::kPresent;
}

void UnitGather::acquire(size_t index) {
  if (units_[index].numel == 0) return;
  if (units_[index].state == State::kFree) launch(index);
  if (units_[index].state == State::kPending) wait(index);
}

void UnitGather::prefetch(int64_t index) {
  if (index < 0 || index >= static_cast<int64_t>(num_units())) return;
  Unit& u = units_[static_cast<size_t>(index)];
  if (u.numel > 0 && u.state == State::kFree) launch(static_cast<size_t>(index));
}

void UnitGather::release(size_t index) {
  Unit& u = units_[index];
  if (u.numel == 0 || u.state == State::kFree) return;
  if (u.state == State::kPending) wait(index);  // never free a buffer that a gather still writes
  free(u);
}

torch::Tensor UnitGather::run(size_t unit, const std::function<torch::Tensor()>& forward) {
  if (unit >= num_units() || (unit != next_forward_ && unit != 0)) {
    throw InternalError(fmt::format("--zero-sharding full: the model ran unit {} {} of its {} units; a model runs its "
                                    "units in index order, each once a forward pass (ShardableModel::units())",
                                    unit, next_forward_ == 0 ? std::string("first") : fmt::format("after unit {}", next_forward_ - 1),
                                    num_units()));
  }
  // A pass's first unit: units that the last backward left gathered (a parameter without a gradient) are freed
  // first, so that this pass gathers what every other rank gathers (Note [Sharded parameters], "A branch").
  if (unit == 0) release_all();
  next_forward_ = unit + 1 == num_units() ? 0 : unit + 1;
  acquire(unit);
  prefetch(static_cast<int64_t>(unit) + 1);
  torch::Tensor out = forward();
  Unit& u = units_[unit];
  if (torch::GradMode::is_enabled() && out.requires_grad() && u.numel > 0) {
    u.grads_left = 0;
    for (size_t p : u.params) u.grads_left += params_[p].requires_grad() ? 1 : 0;
    u.in_backward = true;
    out.register_hook([this, unit](const torch::Tensor&) { on_backward(unit); });
  }
  release(unit);
  return out;
}

void UnitGather::on_backward(size_t unit) {
  acquire(unit);
  prefetch(static_cast<int64_t>(unit) - 1);
}

void UnitGather::on_gradient(size_t unit) {
  Unit& u = units_[unit];
  if (!u.in_backward) return;
  if (--u.grads_left > 0) return;
  u.in_backward = false;
  release(unit);
}

void UnitGather::release_all() {
  for (size_t u = 0; u + 1 < units_.size(); ++u) {
    units_[u].in_backward = false;
    release(u);
  }
  next_forward_ = 0;
}

void UnitGather::gather_root() {
  const size_t root = units_.size() - 1;
  if (units_[root].numel == 0) return;
  launch(root);
  wait(root);
}

void UnitGather::visit_whole(const std::function<void(size_t param)>& visit) {
  for (size_t u = 0; u < units_.size(); ++u) {
    const bool root = u + 1 == units_.size();
    if (!root) acquire(u);
    for (size_t p : units_[u].params) visit(p);
    if (!root) release(u);
  }
}

std::vector<torch::Tensor> UnitGather::parameter_digests() {
  std::vector<torch::Tensor> out(params_.size());
  visit_whole([&](size_t p) {
    const torch::Tensor bytes = params_[p].detach().to(torch::kCPU).contiguous();
    const uLong crc = crc32_z(crc32(0L, Z_NULL, 0), static_cast<const Bytef*>(bytes.data_ptr()), bytes.nbytes());
    out[p] = torch::tensor(static_cast<int64_t>(crc), torch::kInt64).reshape({1});
  });
  return out;
}

std::vector<torch::Tensor> UnitGather::whole_parameters(bool keep) {
  std::vector<torch::Tensor> out(keep ? params_.size() : 0);
  visit_whole([&](size_t p) {
    if (keep) out[p] = params_[p].detach().to(torch::kCPU, false, /*copy=*/true);
  });
  return out;
}

}  // namespace hetseq
