// An update of tiny BERT through the real task, data and Controller, in a world of one on the CPU: the host reads
// nothing of the device's values inside the update (Note [Reading an update late]), counted by LibTorch's own
// dispatcher (Note [Counting operators]), in fp32 and under bf16 autocast, and the statistics read late are the
// update's. The control: a task that reads its loss with item() inside the update is seen, once per update.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <torch/torch.h>

#include "bert/shard_writer.h"
#include "hetseq/observe/op_counter.h"
#include "hetseq/optim/adam.h"
#include "hetseq/optim/fixed.h"
#include "hetseq/train/controller.h"
#include "support/temp_dir.h"
#include "support/test_paths.h"
#include "tasks/bert/bert_config.h"
#include "tasks/bert/bert_task.h"

using hetseq::Batch;
using hetseq::test::TempDir;

namespace {

/// The bert task; with `read_loss`, its train_step also reads the loss on the host, as a task must not.
class ReadingBertTask final : public hetseq::Task {
 public:
  ReadingBertTask(hetseq::bert::BertTaskOptions options, bool read_loss)
      : inner_(std::move(options)), read_loss_(read_loss) {}
  std::shared_ptr<torch::nn::Module> build_model() override { return inner_.build_model(); }
  std::shared_ptr<hetseq::Dataset> load_dataset(const std::string& split) override {
    return inner_.load_dataset(split);
  }
  hetseq::StepOutput compute_loss(torch::nn::Module& model, const Batch& batch) override {
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

struct Run {
  int64_t host_reads = 0;  // over the counted updates
  int64_t ops = 0;
  std::vector<hetseq::UpdateResult> late;  // [counted update] as train_update returned it
  std::optional<hetseq::UpdateResult> last_read;
};

/// Tiny BERT on a shard of 64 sequences of 16 tokens: `warm` updates, then `counted` updates under an OpCounter,
/// two micro-batches of 4 each, Adam (fused), clip 0.5.
Run train(hetseq::Precision precision, bool read_loss, int warm, int counted) {
  TempDir dir;
  hetseq::test::write_shard(dir / "tiny_train_0.hdf5", hetseq::test::make_shard(64, 16, 4));
  hetseq::bert::BertTaskOptions o;
  o.data = dir.path();
  o.config_file = hetseq::test::source_dir() + "/configs/bert-tiny.json";
  o.config = hetseq::bert::read_bert_config(o.config_file);
  o.max_pred_length = 4;
  torch::manual_seed(1);
  ReadingBertTask task(o, read_loss);
  auto model = task.build_model();
  auto data = task.load_dataset("train");
  hetseq::optim::AdamOptions adam;
  adam.lr = 1e-3;
  auto optimizer = std::make_unique<hetseq::optim::Adam>(model->parameters(), adam);
  hetseq::optim::FixedOptions fixed;
  fixed.lrs = {1e-3};
  auto scheduler = std::make_unique<hetseq::optim::Fixed>(*optimizer, fixed);
  hetseq::ControllerOptions options;
  options.clip_norm = 0.5;
  options.precision = precision;
  hetseq::Controller controller(task, model, std::move(optimizer), std::move(scheduler),
                                std::make_shared<hetseq::LocalReducer>(), options);
  // Collated before the count, as the loader's threads would (their reads of host data are not the update's).
  std::vector<std::vector<Batch>> batches;  // [update][micro-batch]
  for (int u = 0; u < warm + counted; ++u) {
    std::vector<Batch> micro;
    for (int k = 0; k < 2; ++k) {
      std::vector<int64_t> rows;
      for (int i = 0; i < 4; ++i) rows.push_back((u * 8 + k * 4 + i) % 64);
      micro.push_back(data->collate(rows));
    }
    batches.push_back(std::move(micro));
  }
  auto update = [&](int u) { return controller.train_update(batches[static_cast<size_t>(u)]); };
  for (int u = 0; u < warm; ++u) update(u);
  Run run;
  {
    hetseq::OpCounter counter;
    for (int u = warm; u < warm + counted; ++u) run.late.push_back(update(u));
    run.host_reads = counter.host_reads();
    run.ops = counter.ops();
  }
  run.last_read = controller.read_late_update();
  return run;
}

}  // namespace

TEST_CASE("An update of tiny BERT reads nothing from the device inside it, counted by the dispatcher",
          "[bert][train][sync]") {
  const hetseq::Precision precision = GENERATE(hetseq::Precision::kFloat32, hetseq::Precision::kBFloat16);
  INFO("precision " << hetseq::to_string(precision));
  const Run run = train(precision, /*read_loss=*/false, /*warm=*/2, /*counted=*/3);
  CHECK(run.host_reads == 0);
  CHECK(run.ops > 100 * 3);  // the counter saw the updates' operators (hundreds each)
  for (const auto& r : run.late) {
    CHECK(r.late);
    CHECK(r.host_reads == 0);
    CHECK(r.sums.count("loss") == 0);  // a device value, not read yet
    CHECK(r.sums.at("sample_size") == 8);
  }
  // The last update's values, read after it: its loss (bits per sequence, finite and positive) and its norm.
  REQUIRE(run.last_read);
  CHECK(run.last_read->sums.at("loss") > 0);
  CHECK(std::isfinite(run.last_read->gnorm));
  CHECK(run.last_read->gnorm > 0);
  CHECK(run.last_read->clipped == (run.last_read->gnorm > 0.5));
}

TEST_CASE("The dispatcher's count sees a host read put into an update", "[bert][train][sync]") {
  const Run run = train(hetseq::Precision::kFloat32, /*read_loss=*/true, /*warm=*/1, /*counted=*/3);
  CHECK(run.host_reads == 2 * 3);  // item() of the loss, in each micro-batch of each counted update
}
