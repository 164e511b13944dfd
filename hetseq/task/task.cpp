#include "hetseq/task/task.h"

#include <torch/autograd.h>
#include <torch/torch.h>

#include "hetseq/core/error.h"

namespace hetseq {

StepOutput Task::train_step(torch::nn::Module& model, const Batch& batch, const Backward& backward) {
  StepOutput out = compute_loss(model, batch);
  if (backward) {
    backward(out);
  } else {
    out.loss.backward();
  }
  return out;
}

StepOutput Task::valid_step(torch::nn::Module& model, const Batch& batch) {
  torch::NoGradGuard no_grad;
  return compute_loss(model, batch);
}

// Note [Statistics on the device]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A task's losses and correct counts come out of the forward pass as device tensors. Reading each
// with .item() made every micro-batch wait for the device several times (six reads for BERT) before
// the next forward could be queued. Now a task returns them as 0-dim tensors (StepOutput::log_tensors)
// and keeps on the host only what the batch itself says (sample counts). The Controller adds the
// tensors up over the update's micro-batches on the device, in float64, and reads them all with one
// copy when the statistics must travel (the start of the last backward, Note [Stat sync]); validation
// reads them once per validation run. The sums are the same doubles as before, bit for bit: each
// tensor is converted to float64 exactly as .item<double>() converted it, and added in the same
// order. Per update this leaves two reads on the host: the statistics, and the gradient norm that
// decides clipping and overflow (UpdateResult::host_reads counts them).

void add_log_tensors(LogTensors& into, const LogTensors& from) {
  for (const auto& [name, value] : from) {
    HETSEQ_ASSERT(value.defined() && value.numel() == 1, "the log tensor '{}' must be a scalar", name);
    const torch::Tensor v = value.detach().reshape({}).to(torch::kFloat64);
    auto it = into.find(name);
    if (it == into.end()) {
      into.emplace(name, v);
    } else {
      it->second = it->second + v;
    }
  }
}

bool add_to_host(LogSums& sums, const LogTensors& tensors) {
  if (tensors.empty()) return false;
  std::vector<torch::Tensor> values;
  values.reserve(tensors.size());
  for (const auto& [name, value] : tensors) values.push_back(value.detach().reshape({}).to(torch::kFloat64));
  const torch::Tensor host = torch::stack(values).to(torch::kCPU);
  const double* data = host.data_ptr<double>();
  size_t i = 0;
  for (const auto& [name, value] : tensors) sums[name] += data[i++];
  return true;
}

namespace {

// What StepOutput::add refuses; `tensor`: whether a tensor (log_tensors) or a host count (log) is added.
void check_addable(const StepOutput& step, const Metric& metric, bool tensor) {
  HETSEQ_ASSERT(metric != metrics::kSampleSize,
                "the metric 'sample_size' is StepOutput::sample_size: set that field instead of adding it");
  const bool elsewhere = tensor ? step.log.count(metric.key()) > 0 : step.log_tensors.count(metric.key()) > 0;
  HETSEQ_ASSERT(!elsewhere, "the metric '{}' was added both as a tensor and as a host count in one step; add it one "
                "way", metric.name());
}

}  // namespace

void StepOutput::add(const Metric& metric, const torch::Tensor& value) {
  check_addable(*this, metric, true);
  HETSEQ_ASSERT(value.defined() && value.numel() == 1, "the metric '{}' got a tensor of {} elements; add a 0-dim sum",
                metric.name(), value.defined() ? value.numel() : 0);
  const torch::Tensor v = value.detach().reshape({});
  auto [it, inserted] = log_tensors.emplace(metric.key(), v);
  if (!inserted) it->second = it->second + v;
}

void StepOutput::add(const Metric& metric, double value) {
  check_addable(*this, metric, false);
  log[metric.key()] += value;
}

LogTensors logged_tensors(const StepOutput& step) {
  const std::string loss = metrics::kLoss.key();
  if (!step.loss.defined() || step.log.count(loss) > 0 || step.log_tensors.count(loss) > 0) {
    return step.log_tensors;
  }
  LogTensors tensors = step.log_tensors;
  tensors.emplace(loss, step.loss.detach());
  return tensors;
}

LogSums host_log(const StepOutput& step) {
  LogSums sums = step.log;
  add_to_host(sums, logged_tensors(step));
  sums[metrics::kSampleSize.key()] = step.sample_size;
  return sums;
}

std::vector<Ratio> Task::ratios() const { return {}; }

std::map<std::string, double> Task::derived_metrics(const MetricSums& sums) const {
  return evaluate(ratios(), sums);
}

}  // namespace hetseq
