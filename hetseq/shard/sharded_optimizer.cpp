#include "hetseq/shard/sharded_optimizer.h"

#include "hetseq/core/error.h"
#include "hetseq/core/format.h"
#include "hetseq/world/lost_peer.h"

namespace hetseq {

// Note [Sharded optimizer state]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// With --zero-sharding os each rank keeps optimizer state (Adam's two moments, SGD's momentum,
// Adadelta's two averages) for a shard of the parameters only, sized by its memory budget.
//
// The shards. Lay the parameters end to end, in their order, as one flat space of T elements. Rank r
// owns the contiguous range [first_r, first_r + numel_r); the boundaries are the budgets' cumulative
// shares of T, rounded to multiples of 16 elements (plan_shards), the last rank taking the rest, so
// the shards cover T exactly and budgets 1:1:2 give 1/4, 1/4, 1/2 within 16 elements. A parameter
// may straddle two (or more) ranks: each rank's shard is a list of 1-D views, one per parameter it
// touches, narrow()ed out of the parameter's own storage (shard_slices, slice_views). The optimizer
// is the ordinary one, built by the same factory over these views, so its buffers (zeros_like the
// views) have the shard's size: the memory saved is (1 - numel_r / T) of the state.
//
// The update, as the Controller runs it through the `os` ShardingStrategy (OptimizerStateSharding).
// reduce(): the reducer allreduces the full gradients as without sharding, and the Controller divides,
// measures the global norm, checks overflow and clips them on every rank as before: every rank holds
// the same reduced gradients, so the norm and the clip factor are the global ones with no further
// collective. step() (step_shard) then gives each view the same view of its parameter's gradient and
// runs the optimizer on the views (updating the parameters' storage in place); gather() brings the
// shards to every rank (ShardGather, Note [Gathering uneven shards]).
//
// Exactness. Adam (with weight decay), SGD with momentum and Adadelta are elementwise: an element's
// new value and state depend only on that element's value, gradient and state, the learning rate and
// the update count, which every rank shares (a view is updated whenever its parameter has a gradient,
// so its count is the parameter's). The norm is computed from the same full gradients. So each
// element of a shard gets what the unsharded step gives it, in exact arithmetic. In floating point
// it is also bit for bit, because each element goes through the same sequence of rounded operations:
// the per-tensor and foreach CPU kernels apply the same scalar operations to each element whatever
// the tensor's length, and the fused Adam CPU kernel, whose vectorised body and scalar tail see
// different elements of a slice that starts mid-vector, was observed to give the same bits there
// too: tests/train/test_sharded_optimizer.cpp compares with torch::equal for fused and foreach Adam
// (weight decay, clipped gradients), SGD with momentum and Adadelta, with shard boundaries at
// multiples of 16 and at odd offsets (alignment 1), and tensors straddling ranks; the 3-process test
// compares hetseq-train's parameters after 30 updates. CUDA kernels are not tested here. The
// gather copies bits. Under --fp16/--bf16 the parameters stay float32 (autocast), so the sharded
// state is the whole of what the optimizer keeps; there are no separate master weights.
//
// os+grad (each rank keeping only its slice of the reduced gradients): Note [Sharded gradients]
// (shard_reducer.cpp); the step there reads the reducer's shard instead of the parameters' gradients. Checkpoints:
// see Note [Sharded optimizer state in checkpoints] (sharded_save.cpp).

std::vector<int64_t> exchange_budgets(const c10::intrusive_ptr<c10d::ProcessGroup>& group, int64_t budget_bytes,
                                      const torch::Device& device) {
  const int64_t world = group->getSize();
  const auto int_options = torch::TensorOptions().dtype(torch::kInt64).device(device);
  std::vector<torch::Tensor> input{torch::full({1}, budget_bytes, int_options)};
  std::vector<std::vector<torch::Tensor>> output(1);
  for (int64_t r = 0; r < world; ++r) output[0].push_back(torch::empty({1}, int_options));
  wait_for_peers(group->allgather(output, input), group->getRank(), world, "allgather of the memory budgets");
  std::vector<int64_t> budgets;  // [rank]
  for (const auto& b : output[0]) budgets.push_back(b.cpu().item<int64_t>());
  return budgets;
}

std::vector<ShardReport> exchange_shard_reports(const c10::intrusive_ptr<c10d::ProcessGroup>& group,
                                                const ShardReport& mine, const torch::Device& device) {
  const auto int_options = torch::TensorOptions().dtype(torch::kInt64).device(device);
  const std::vector<int64_t> figures{mine.rank,         mine.first,        mine.numel,     mine.state_bytes,
                                     mine.budget_bytes, mine.param_bytes, mine.grad_bytes};
  std::vector<torch::Tensor> input{torch::tensor(figures, torch::kInt64).to(device)};
  std::vector<std::vector<torch::Tensor>> output(1);
  for (int64_t r = 0; r < group->getSize(); ++r) {
    output[0].push_back(torch::empty({static_cast<int64_t>(figures.size())}, int_options));
  }
  wait_for_peers(group->allgather(output, input), group->getRank(), group->getSize(),
                 "allgather of the optimizer shards' figures");
  std::vector<ShardReport> reports;  // [rank]
  for (const auto& t : output[0]) {
    const torch::Tensor c = t.cpu();
    const int64_t* v = c.data_ptr<int64_t>();
    reports.push_back(ShardReport{v[0], v[1], v[2], v[3], v[4], v[5], v[6]});
  }
  return reports;
}

std::unique_ptr<ShardedOptimizer> ShardedOptimizer::create(std::vector<torch::Tensor> params,
                                                           const optim::OptimizerFactory& make,
                                                           c10::intrusive_ptr<c10d::ProcessGroup> group,
                                                           ShardedOptimizerOptions options, Report report) {
  HETSEQ_ASSERT(group, "ShardedOptimizer without a process group");
  HETSEQ_ASSERT(!params.empty(), "ShardedOptimizer without parameters");
  std::vector<int64_t> numels;  // [param]
  int64_t total = 0;
  for (const auto& p : params) {
    numels.push_back(p.numel());
    total += p.numel();
  }
  const std::vector<int64_t> budgets = exchange_budgets(group, options.budget_bytes, params[0].device());
  std::vector<ShardRange> plan = plan_shards(budgets, total, options.alignment);
  const ShardRange mine = plan[static_cast<size_t>(group->getRank())];
  std::vector<ShardSlice> slices = shard_slices(numels, mine);
  std::vector<torch::Tensor> views = slice_views(params, slices);
  std::unique_ptr<optim::Optimizer> shard = make(views);
  std::unique_ptr<ShardGather> gather;
  if (options.gather_parameters) gather = std::make_unique<ShardGather>(group, plan, params, options.gather);
  return std::unique_ptr<ShardedOptimizer>(new ShardedOptimizer(
      std::move(params), std::move(slices), std::move(views), std::move(shard), std::move(plan), std::move(gather),
      std::move(group), options.budget_bytes, std::move(report)));
}

ShardedOptimizer::ShardedOptimizer(std::vector<torch::Tensor> params, std::vector<ShardSlice> slices,
                                   std::vector<torch::Tensor> views, std::unique_ptr<optim::Optimizer> shard,
                                   std::vector<ShardRange> plan, std::unique_ptr<ShardGather> gather,
                                   c10::intrusive_ptr<c10d::ProcessGroup> group, int64_t budget_bytes, Report report)
    : Optimizer(std::move(params), shard->lr()),
      slices_(std::move(slices)),
      views_(std::move(views)),
      shard_(std::move(shard)),
      plan_(std::move(plan)),
      gather_(std::move(gather)),
      group_(std::move(group)),
      budget_bytes_(budget_bytes),
      report_(std::move(report)) {}

void ShardedOptimizer::step() {
  step_shard();
  gather();
}

void ShardedOptimizer::step_shard() {
  torch::NoGradGuard no_grad;
  shard_->set_lr(lr());
  for (size_t k = 0; k < views_.size(); ++k) {
    if (!shard_grads_.empty()) {
      views_[k].mutable_grad() = shard_grads_[k];
      continue;
    }
    const ShardSlice& s = slices_[k];
    const torch::Tensor& g = params()[s.param].grad();
    if (g.defined()) {
      views_[k].mutable_grad() = g.reshape({-1}).narrow(0, s.offset, s.numel);
    } else {
      views_[k].mutable_grad().reset();
    }
  }
  shard_->step();
  for (auto& v : views_) v.mutable_grad().reset();
}

void ShardedOptimizer::use_gradients(std::vector<torch::Tensor> grads) {
  HETSEQ_ASSERT(grads.size() == views_.size(), "{} shard gradients for {} views", grads.size(), views_.size());
  shard_grads_ = std::move(grads);
}

void ShardedOptimizer::gather() {
  if (gather_) gather_->gather();
  report_once();
}

void ShardedOptimizer::use_parameter_shard(const torch::Tensor& shard) {
  torch::NoGradGuard no_grad;
  HETSEQ_ASSERT(shard.numel() == this->shard().numel, "a parameter shard of {} elements for a shard of {}",
                shard.numel(), this->shard().numel);
  // The slices cover the shard in order, end to end.
  int64_t at = 0;
  for (size_t k = 0; k < views_.size(); ++k) {
    views_[k].set_data(shard.narrow(0, at, slices_[k].numel));
    at += slices_[k].numel;
  }
}

int64_t ShardedOptimizer::state_bytes() const {
  int64_t bytes = 0;
  for (const auto& [name, t] : shard_->state()) {
    const bool buffer = name.rfind("param.", 0) == 0 && name.size() >= 5 && name.substr(name.size() - 5) != ".step";
    if (buffer) bytes += static_cast<int64_t>(t.nbytes());
  }
  return bytes;
}

// A collective at the end of the first step: every rank's figures to every rank.
void ShardedOptimizer::report_plan() {
  reported_ = true;
  const ShardRange mine = shard();
  // What this rank holds: every parameter, and every gradient under os; under os+grad its shard's, and any
  // parameter's gradient left (none: the reducer freed them).
  int64_t param_bytes = 0, grad_bytes = 0;
  for (const auto& p : params()) {
    param_bytes += static_cast<int64_t>(p.nbytes());
    if (p.grad().defined()) grad_bytes += static_cast<int64_t>(p.grad().nbytes());
  }
  if (held_param_bytes_) param_bytes = held_param_bytes_();
  for (const auto& g : shard_grads_) grad_bytes += static_cast<int64_t>(g.nbytes());
  const ShardReport figures{static_cast<int64_t>(group_->getRank()), mine.first, mine.numel, state_bytes(),
                            budget_bytes_, param_bytes, grad_bytes};
  const std::vector<ShardReport> reports = exchange_shard_reports(group_, figures, params()[0].device());
  if (report_) report_(reports);
}

std::map<std::string, torch::Tensor> ShardedOptimizer::state() const {
  std::map<std::string, torch::Tensor> out;
  out["lr"] = torch::scalar_tensor(lr(), torch::kFloat64);
  out["num_steps"] = torch::scalar_tensor(shard_->num_steps(), torch::kInt64);
  out["num_params"] = torch::scalar_tensor(static_cast<int64_t>(params().size()), torch::kInt64);
  return out;
}

optim::StatePiece ShardedOptimizer::state_piece() const {
  optim::StatePiece piece;
  piece.first = shard().first;
  piece.numel = shard().numel;
  // The shard optimizer's "param.{k}.*" (view k) become "param.{i}.*" of the parameter the view is in.
  for (const auto& [key, t] : shard_->state()) {
    if (key.rfind("param.", 0) != 0) continue;
    const size_t dot = key.find('.', 6);
    const auto k = static_cast<size_t>(std::stoll(key.substr(6, dot - 6)));
    HETSEQ_ASSERT(k < slices_.size(), "shard optimizer state names view {} of {}", k, slices_.size());
    piece.state[fmt::format("param.{}.{}", slices_[k].param, key.substr(dot + 1))] = t.reshape({-1});
  }
  return piece;
}

void ShardedOptimizer::load_state(const std::map<std::string, torch::Tensor>& scalars,
                                  const optim::StateSource& pieces) {
  const auto num_params = scalars.find("num_params");
  if (num_params == scalars.end() || num_params->second.item<int64_t>() != static_cast<int64_t>(params().size())) {
    throw InputError(fmt::format("optimizer state: {} parameters saved, the model has {}",
                                 num_params == scalars.end() ? std::string("no count of") :
                                                               std::to_string(num_params->second.item<int64_t>()),
                                 params().size()));
  }
  std::vector<int64_t> numels;  // [param]
  for (const auto& p : params()) numels.push_back(p.numel());
  const optim::StatePiece piece = pieces.read_range(shard().first, shard().numel, numels);
  std::map<std::string, torch::Tensor> mine;
  for (const auto& [key, t] : scalars) {
    if (key.rfind("param.", 0) != 0) mine[key] = t;
  }
  mine["num_params"] = torch::scalar_tensor(static_cast<int64_t>(views_.size()), torch::kInt64);
  // View k holds the elements of parameter slices_[k].param that lie in the shard: the piece's entries
  // of that parameter, which read_range cut to the same elements.
  for (size_t k = 0; k < slices_.size(); ++k) {
    const std::string prefix = fmt::format("param.{}.", slices_[k].param);
    for (auto it = piece.state.lower_bound(prefix); it != piece.state.end() && it->first.rfind(prefix, 0) == 0; ++it) {
      const std::string rest = it->first.substr(prefix.size());
      HETSEQ_ASSERT(rest == "step" || it->second.numel() == slices_[k].numel,
                    "read_range gave {} {} elements for a view of {}", it->first, it->second.numel(),
                    slices_[k].numel);
      mine[fmt::format("param.{}.{}", k, rest)] = it->second;
    }
  }
  shard_->load_state(mine);
  set_lr(shard_->lr());
}

void ShardedOptimizer::load_state(const std::map<std::string, torch::Tensor>& state) {
  const auto num_params = state.find("num_params");
  if (num_params == state.end() || num_params->second.item<int64_t>() != static_cast<int64_t>(params().size())) {
    throw InputError(fmt::format("optimizer state: {} parameters saved, the model has {}",
                                 num_params == state.end() ? std::string("no count of") :
                                                             std::to_string(num_params->second.item<int64_t>()),
                                 params().size()));
  }
  // The shard optimizer's state: view k takes parameter slices_[k].param's entries, narrowed.
  std::map<std::string, torch::Tensor> mine;
  for (const auto& [key, t] : state) {
    if (key.rfind("param.", 0) == 0) continue;
    mine[key] = t;
  }
  mine["num_params"] = torch::scalar_tensor(static_cast<int64_t>(views_.size()), torch::kInt64);
  for (size_t k = 0; k < slices_.size(); ++k) {
    const ShardSlice& s = slices_[k];
    const std::string prefix = fmt::format("param.{}.", s.param);
    for (auto it = state.lower_bound(prefix); it != state.end() && it->first.rfind(prefix, 0) == 0; ++it) {
      const std::string rest = it->first.substr(prefix.size());
      const std::string key = fmt::format("param.{}.{}", k, rest);
      if (rest == "step") {
        mine[key] = it->second;
      } else {
        if (it->second.numel() != params()[s.param].numel()) {
          throw InputError(fmt::format("optimizer state: {} has {} elements, parameter {} has {}", it->first,
                                       it->second.numel(), s.param, params()[s.param].numel()));
        }
        mine[key] = it->second.reshape({-1}).narrow(0, s.offset, s.numel).clone();
      }
    }
  }
  shard_->load_state(mine);
  set_lr(shard_->lr());
}

}  // namespace hetseq
