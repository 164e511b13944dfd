#pragma once
// The bert task, optionally made to read its loss on the host inside the update, as a task must not: the
// control of the tests that count an update's host reads through the dispatcher.

#include <memory>
#include <string>
#include <vector>

#include "hetseq/task/task.h"
#include "tasks/bert/bert_task.h"

namespace hetseq::test {

/// The bert task; with `read_loss`, its compute_loss also reads the loss with item().
class ReadingBertTask final : public hetseq::Task {
 public:
  ReadingBertTask(hetseq::bert::BertTaskOptions options, bool read_loss)
      : inner_(std::move(options)), read_loss_(read_loss) {}
  std::shared_ptr<torch::nn::Module> build_model() override { return inner_.build_model(); }
  std::shared_ptr<hetseq::Dataset> load_dataset(const std::string& split) override {
    return inner_.load_dataset(split);
  }
  hetseq::StepOutput compute_loss(torch::nn::Module& model, const hetseq::Batch& batch) override {
    hetseq::StepOutput out = inner_.compute_loss(model, batch);
    if (read_loss_) last_loss = out.loss.item<double>();
    return out;
  }
  std::vector<hetseq::Ratio> ratios() const override { return inner_.ratios(); }
  double last_loss = 0;

 private:
  hetseq::bert::BertTask inner_;
  bool read_loss_;
};

}  // namespace hetseq::test
