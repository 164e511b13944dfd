#include "hetseq/optim/optimizer.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <set>
#include <tuple>
#include <type_traits>
#include <utility>

#include "hetseq/core/format.h"
#include <torch/torch.h>

#include "hetseq/core/error.h"

namespace hetseq::optim {

// Note [Optimizer state]
// ~~~~~~~~~~~~~~~~~~~~~~
// Every optimizer keeps, per parameter, an update count and a few buffers shaped like the parameter
// (Adam: exp_avg, exp_avg_sq; Adadelta: square_avg, acc_delta; SGD with momentum: momentum_buffer).
// They live in the base class, `buffers_[param][buffer name]`, and are created at a parameter's first
// update, so a parameter that never had a gradient has neither buffers nor a count (as in fairseq,
// whose Adam keeps `state['step']` per parameter; the bias correction of Adam uses that count, not
// num_steps()). step() updates the parameters in groups that share this count, see Note [Update groups].
//
// The checkpoint form is a flat map of tensors:
//   "lr"               0-dim double, the learning rate of the next step
//   "num_steps"        0-dim int64, calls to step()
//   "num_params"       0-dim int64, to refuse a state saved from a different model
//   "param.{i}.step"   0-dim int64, updates parameter i received
//   "param.{i}.{name}" buffer `name` of parameter i, shaped like the parameter
// A parameter has either all of its entries or none. Buffers of fp16/bf16 parameters are kept in fp32
// (fairseq's Adam computes in fp32 and writes the result back), see apply_update().

namespace {

/// The most bytes of parameters in one update call on the CPU: a chunk's parameters, gradients, buffers
/// and temporaries (about six times as much) then fit in a core's L2 cache. See Note [Update groups].
constexpr size_t kCpuChunkBytes = 256 * 1024;

bool is_reduced_precision(const torch::Tensor& t) {
  return t.scalar_type() == torch::kHalf || t.scalar_type() == torch::kBFloat16;
}

torch::ScalarType compute_dtype(const torch::Tensor& param) {
  return is_reduced_precision(param) ? torch::kFloat : param.scalar_type();
}

std::string shape_str(torch::IntArrayRef sizes) { return fmt::format("[{}]", fmt::join(sizes, ", ")); }

/// Parses "param.{i}.{rest}" into (i, rest); nullopt for any other form.
std::optional<std::pair<size_t, std::string>> parse_param_key(const std::string& key) {
  static const std::string prefix = "param.";
  if (key.compare(0, prefix.size(), prefix) != 0) return std::nullopt;
  const size_t dot = key.find('.', prefix.size());
  if (dot == std::string::npos || dot == prefix.size() || dot + 1 == key.size()) return std::nullopt;
  const std::string digits = key.substr(prefix.size(), dot - prefix.size());
  if (digits.size() > 9 || !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return std::nullopt;
  }
  return std::make_pair(static_cast<size_t>(std::stoul(digits)), key.substr(dot + 1));
}

}  // namespace

Optimizer::Optimizer(std::vector<torch::Tensor> params, double lr)
    : params_(std::move(params)), lr_(lr), param_steps_(params_.size(), 0), buffers_(params_.size()) {
  if (!std::isfinite(lr) || lr < 0) {
    throw UsageError(fmt::format("--lr: the learning rate must be a finite number >= 0, got {}", lr));
  }
  if (params_.empty()) {
    throw InputError("optimizer: the model has no parameters to optimize; check that the task builds a "
                     "model with trainable parameters");
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    HETSEQ_ASSERT(params_[i].defined(), "optimizer parameter {} of {} is undefined", i, params_.size());
  }
}

Optimizer::~Optimizer() = default;

// Note [Zeroing gradients]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// zero_grad() fills the gradients with zeros through one foreach call per device and dtype, not one fill
// per parameter (about 200 kernel launches for BERT-base, one to a few on a GPU). It does not free them
// (set_to_none) during training, for two reasons: under the c10d reducer the gradients are views of the
// reducer's buckets (gradient_as_bucket_view), so a freed gradient would be allocated again by autograd and
// copied into its bucket every update; and in a world of one, an undefined gradient makes the optimizer
// skip a parameter that took no gradient in an update instead of decaying its moments and weights, so one
// process would no longer train what W ranks train (the equality the oracle tests check).
void Optimizer::zero_grad(bool set_to_none) {
  std::map<std::tuple<int, int, int>, std::vector<torch::Tensor>> groups;  // [(device type, index, dtype)]
  for (auto& p : params_) {
    auto& grad = p.mutable_grad();
    if (!grad.defined()) continue;
    if (set_to_none) {
      grad.reset();
      continue;
    }
    if (grad.grad_fn()) {
      grad = grad.detach();
    } else if (grad.requires_grad()) {
      grad.requires_grad_(false);
    }
    groups[{static_cast<int>(grad.device().type()), static_cast<int>(grad.device().index()),
            static_cast<int>(grad.scalar_type())}]
        .push_back(grad);
  }
  for (auto& [key, grads] : groups) at::_foreach_zero_(grads);
}

void Optimizer::set_lr(double lr) {
  HETSEQ_ASSERT(std::isfinite(lr) && lr >= 0, "learning rate {} set on optimizer '{}'", lr, name());
  lr_ = lr;
}

// Note [Update groups]
// ~~~~~~~~~~~~~~~~~~~~
// step() runs each operation of an update once per group of parameters (LibTorch's _foreach_* and _fused_*
// kernels over a tensor list), not once per parameter: on a GPU one launch instead of one per tensor, on a CPU
// one dispatch. A group holds the parameters with a gradient that share
//   - the device and the compute dtype (a foreach kernel's fast path needs one of each), and
//   - the update count param_step(i). Adam's bias correction depends on it (see Note [Optimizer state]); a
//     parameter that had no gradient on some update (unused on every rank with --find-unused-parameters)
//     counts fewer updates than the rest and is updated in a group of its own, with its own correction.
// Members are in ascending parameter order; groups are independent, so their order does not matter.
//
// On a CPU, LibTorch has no fast path for the _foreach_* kernels: a call runs its operation on each member in
// turn. A group of a whole model would then stream every parameter through memory once per operation (Adadelta
// has ten), where the per-parameter loop ran all operations on one parameter while it sat in cache. So a group
// on the CPU is passed to the update in chunks of members totalling at most kCpuChunkBytes of parameters (a
// larger parameter is a chunk of its own): small tensors still share a call, and a chunk stays in cache
// (benchmarks/optimizer_step.cpp measures both). On other devices a group is one call.
//
// On a CPU the _foreach_* kernels apply the per-tensor operation to each member in turn, so an update through
// them is bit-equal to the per-parameter update it replaced (tests/optim/test_foreach_optimizers.cpp checks
// this over several steps). On CUDA their fast path computes each element in the op-math type of the dtype
// (float for fp32, fp16, bf16), as the per-tensor kernels do. Adam's fused kernel is the exception that is
// only close, not equal: see Note [Fused Adam].

void Optimizer::prepare_step() { HETSEQ_ASSERT(false, "optimizer '{}' does not split its step", name()); }

void Optimizer::run_step() { HETSEQ_ASSERT(false, "optimizer '{}' does not split its step", name()); }

std::vector<torch::Tensor> Optimizer::step_tensors() const {
  std::vector<torch::Tensor> out;  // [param][buffer name], flattened
  for (const auto& buffers : buffers_) {
    for (const auto& [buffer_name, value] : buffers) out.push_back(value);
  }
  return out;
}

void Optimizer::apply_update(const UpdateFn& update) {
  count_step();
  for_each_group(update);
}

void Optimizer::count_step() {
  for (size_t i = 0; i < params_.size(); ++i) {
    const torch::Tensor& g = params_[i].grad();
    if (g.defined() && g.is_sparse()) {
      throw InputError(fmt::format("optimizer '{}': parameter {} (shape {}) has a sparse gradient, which is "
                                   "not supported; use dense embeddings",
                                   name(), i, shape_str(params_[i].sizes())));
    }
  }
  ++num_steps_;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (params_[i].grad().defined()) ++param_steps_[i];
  }
}

void Optimizer::for_each_group(const UpdateFn& update, bool copies) {
  torch::NoGradGuard no_grad;
  // (device type, device index, compute dtype, update count) -> group. See Note [Update groups].
  using Key = std::tuple<int, int, int, int64_t>;
  std::map<Key, UpdateGroup> groups;
  // The fp16/bf16 parameters of each group, to be written back from their fp32 copies: [group][reduced member]
  std::map<Key, std::pair<std::vector<torch::Tensor>, std::vector<torch::Tensor>>> write_back;  // (to, from)
  for (size_t i = 0; i < params_.size(); ++i) {
    torch::Tensor& p = params_[i];
    const torch::Tensor& g = p.grad();
    if (!g.defined()) continue;
    const torch::ScalarType dtype = compute_dtype(p);
    const Key key{static_cast<int>(p.device().type()), static_cast<int>(p.device().index()), static_cast<int>(dtype),
                  param_steps_[i]};
    UpdateGroup& group = groups[key];
    group.step = param_steps_[i];
    group.index.push_back(i);
    if (copies && is_reduced_precision(p)) {
      group.params.push_back(p.to(dtype));
      write_back[key].first.push_back(p);
      write_back[key].second.push_back(group.params.back());
    } else {
      group.params.push_back(p);
    }
    group.grads.push_back(!copies || g.scalar_type() == dtype ? g : g.to(dtype));
  }
  for (auto& [key, group] : groups) {
    // [chunk] of members: one on a GPU, cache-sized ones on the CPU (see Note [Update groups]).
    const bool on_cpu = std::get<0>(key) == static_cast<int>(c10::DeviceType::CPU);
    const size_t n = group.index.size();
    // In the compute dtype, with or without the copies: the same chunks either way.
    const size_t item = c10::elementSize(static_cast<torch::ScalarType>(std::get<2>(key)));
    const auto bytes_of = [&](size_t k) { return static_cast<size_t>(group.params[k].numel()) * item; };
    for (size_t begin = 0, end = 0; begin < n; begin = end) {
      size_t bytes = bytes_of(begin);
      end = begin + 1;
      while (end < n && (!on_cpu || bytes + bytes_of(end) <= kCpuChunkBytes)) bytes += bytes_of(end++);
      if (begin == 0 && end == n) {
        update(group);
      } else {
        const auto slice = [&](const auto& v) { return std::decay_t<decltype(v)>(v.begin() + begin, v.begin() + end); };
        UpdateGroup chunk{group.step, slice(group.index), slice(group.params), slice(group.grads)};
        update(chunk);
      }
    }
    const auto reduced = write_back.find(key);
    if (reduced != write_back.end()) at::_foreach_copy_(reduced->second.first, reduced->second.second);
  }
}

std::vector<torch::Tensor> Optimizer::buffers(const UpdateGroup& group, const std::string& name) {
  std::vector<torch::Tensor> out;  // [member]
  out.reserve(group.index.size());
  for (size_t k = 0; k < group.index.size(); ++k) out.push_back(buffer(group.index[k], name, group.params[k]));
  return out;
}

bool Optimizer::has_buffer(size_t i, const std::string& name) const { return buffers_.at(i).count(name) > 0; }

torch::Tensor& Optimizer::buffer(size_t i, const std::string& name, const torch::Tensor& like) {
  auto& slot = buffers_.at(i)[name];
  if (!slot.defined()) slot = torch::zeros_like(like, torch::MemoryFormat::Preserve);
  return slot;
}

void Optimizer::set_buffer(size_t i, const std::string& name, torch::Tensor value) {
  buffers_.at(i)[name] = std::move(value);
}

std::map<std::string, torch::Tensor> Optimizer::state() const {
  std::map<std::string, torch::Tensor> out;
  out["lr"] = torch::scalar_tensor(lr_, torch::kFloat64);
  out["num_steps"] = torch::scalar_tensor(num_steps_, torch::kInt64);
  out["num_params"] = torch::scalar_tensor(static_cast<int64_t>(params_.size()), torch::kInt64);
  for (size_t i = 0; i < params_.size(); ++i) {
    if (param_steps_[i] == 0) continue;
    out[fmt::format("param.{}.step", i)] = torch::scalar_tensor(param_steps_[i], torch::kInt64);
    for (const auto& [buffer_name, value] : buffers_[i]) {
      out[fmt::format("param.{}.{}", i, buffer_name)] = value.detach();
    }
  }
  return out;
}

void Optimizer::load_state(const std::map<std::string, torch::Tensor>& state) {
  const auto fail = [this](const std::string& what) {
    throw InputError(fmt::format("optimizer '{}': cannot load its state: {}; the checkpoint was saved from a "
                                 "different model or optimizer",
                                 name(), what));
  };
  const auto integral_scalar = [&](const std::string& key, const torch::Tensor& t) -> int64_t {
    if (!t.defined() || t.numel() != 1 || !c10::isIntegralType(t.scalar_type(), /*includeBool=*/false)) {
      fail(fmt::format("entry '{}' must be one integer", key));
    }
    return t.item<int64_t>();
  };

  const std::vector<std::string> names = buffer_names();
  std::optional<double> lr;
  std::optional<int64_t> num_steps;
  std::optional<int64_t> num_params;
  std::vector<int64_t> param_steps(params_.size(), 0);                       // [param]
  std::vector<std::map<std::string, torch::Tensor>> buffers(params_.size());  // [param][buffer name]
  std::vector<std::set<std::string>> seen(params_.size());                    // [param]

  for (const auto& [key, value] : state) {
    if (key == "lr") {
      if (!value.defined() || value.numel() != 1) fail("entry 'lr' must be one number");
      lr = value.item<double>();
      if (!std::isfinite(*lr) || *lr < 0) fail(fmt::format("entry 'lr' is {}, not a finite number >= 0", *lr));
    } else if (key == "num_steps") {
      num_steps = integral_scalar(key, value);
      if (*num_steps < 0) fail(fmt::format("entry 'num_steps' is {} < 0", *num_steps));
    } else if (key == "num_params") {
      num_params = integral_scalar(key, value);
    } else if (auto parsed = parse_param_key(key)) {
      const auto& [i, entry] = *parsed;
      if (i >= params_.size()) {
        fail(fmt::format("entry '{}' names parameter {} but the model has {} parameters", key, i, params_.size()));
      }
      if (entry == "step") {
        param_steps[i] = integral_scalar(key, value);
        if (param_steps[i] < 1) fail(fmt::format("entry '{}' is {} < 1", key, param_steps[i]));
      } else if (std::find(names.begin(), names.end(), entry) != names.end()) {
        if (!value.defined() || !value.is_floating_point()) {
          fail(fmt::format("entry '{}' must be a floating-point tensor", key));
        }
        if (value.sizes() != params_[i].sizes()) {
          fail(fmt::format("entry '{}' has shape {} but parameter {} has shape {}", key, shape_str(value.sizes()), i,
                           shape_str(params_[i].sizes())));
        }
        buffers[i][entry] = value;
      } else {
        fail(fmt::format("unknown entry '{}' (buffers of '{}': {})", key, name(), fmt::join(names, ", ")));
      }
      seen[i].insert(entry);
    } else {
      fail(fmt::format("unknown entry '{}'", key));
    }
  }

  if (!lr) fail("entry 'lr' is missing");
  if (!num_steps) fail("entry 'num_steps' is missing");
  if (!num_params) fail("entry 'num_params' is missing");
  if (*num_params != static_cast<int64_t>(params_.size())) {
    fail(fmt::format("it has {} parameters but the model has {}", *num_params, params_.size()));
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    if (seen[i].empty()) continue;
    if (!seen[i].count("step")) fail(fmt::format("entry 'param.{}.step' is missing", i));
    for (const auto& buffer_name : names) {
      if (!seen[i].count(buffer_name)) fail(fmt::format("entry 'param.{}.{}' is missing", i, buffer_name));
    }
  }

  // Everything is valid: copy the buffers next to their parameters and commit.
  for (size_t i = 0; i < params_.size(); ++i) {
    for (auto& [buffer_name, value] : buffers[i]) {
      value = value.detach().to(params_[i].device(), compute_dtype(params_[i]), /*non_blocking=*/false,
                                /*copy=*/true);
    }
  }
  lr_ = *lr;
  num_steps_ = *num_steps;
  param_steps_ = std::move(param_steps);
  buffers_ = std::move(buffers);
}

}  // namespace hetseq::optim
