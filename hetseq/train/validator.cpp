#include "hetseq/train/validator.h"

#include <cmath>

#include "hetseq/data/batch_loader.h"

namespace hetseq {

Validator::Validator(Task& task, std::shared_ptr<CollectiveChannel> channel, DataPlan plan, ValidatorOptions options)
    : task_(task),
      channel_(channel ? std::move(channel) : std::make_shared<LocalChannel>()),
      plan_(std::move(plan)),
      options_(options) {
  plan_.validate();
  check_precision_supported(options_.precision, options_.device, "--" + to_string(options_.precision));
}

LogSums Validator::run(const std::shared_ptr<Dataset>& dataset, torch::nn::Module& model) {
  EpochIteratorOptions order;
  order.shuffle = false;
  UpdateStream stream(EpochBatchIterator(dataset->size(), plan_, order),
                      std::make_shared<BatchLoader>(dataset, options_.num_workers));
  stream.begin_epoch(1);
  model.eval();
  LogSums local;
  LogTensors on_device;  // read once, after the last batch (Note [Statistics on the device])
  Batch stand_in;        // stand_ins: the last batch
  while (!stream.end_of_epoch()) {
    for (const Batch& batch : stream.next()) {
      if (batch.empty() && options_.stand_ins) {
        if (stand_in.empty()) stand_in = dataset->collate({0});
        const AutocastGuard autocast(options_.device, options_.precision);
        task_.valid_step(model, stand_in.to(options_.device));
        continue;
      }
      if (batch.empty()) continue;
      if (options_.stand_ins) stand_in = batch;
      const AutocastGuard autocast(options_.device, options_.precision);
      StepOutput out = task_.valid_step(model, batch.to(options_.device));
      out.log["sample_size"] = out.sample_size;
      for (const auto& [k, v] : out.log) local[k] += v;
      add_log_tensors(on_device, logged_tensors(out));
    }
  }
  add_to_host(local, on_device);
  return channel_->sum(local);
}

std::vector<Stat> Validator::stats(const LogSums& sums, int64_t num_updates) const {
  const double sample_size = sum_or(sums, "sample_size");
  const double ntokens = sum_or(sums, "ntokens", sample_size);
  const double loss = sample_size > 0 ? sum_or(sums, "loss") / sample_size / kLn2 : 0;
  const double nll = ntokens > 0 ? sum_or(sums, "nll_loss", sum_or(sums, "loss")) / ntokens / kLn2 : 0;
  std::vector<Stat> stats{{"loss", loss}, {"nll_loss", nll}, {"ppl", std::pow(2.0, nll)},
                          {"num_updates", static_cast<double>(num_updates), true},
                          {"sample_size", sample_size, true}};  // the samples validated, over all ranks
  for (const auto& [name, value] : task_.derived_metrics(sums)) stats.push_back({name, value});
  return stats;
}

}  // namespace hetseq
