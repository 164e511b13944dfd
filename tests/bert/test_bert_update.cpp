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

#include "bert/reading_bert_task.h"
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

struct Run {
  int64_t host_reads = 0;  // over the counted updates
  int64_t ops = 0;
  std::vector<hetseq::UpdateResult> late;  // [counted update] as train_update returned it
  std::optional<hetseq::UpdateResult> last_read;
};

/// Tiny BERT through the bert task (ReadingBertTask, `read_loss`) on a shard of 64 sequences of 16 tokens, under a
/// Controller in a world of one with Adam (fused) at 1e-3, clip 0.5 and `precision`.
struct TinyBert {
  TinyBert(hetseq::Precision precision, bool read_loss) {
    hetseq::test::write_shard(dir / "tiny_train_0.hdf5", hetseq::test::make_shard(64, 16, 4));
    hetseq::bert::BertTaskOptions o;
    o.data = dir.path();
    o.config_file = hetseq::test::source_dir() + "/configs/bert-tiny.json";
    o.config = hetseq::bert::read_bert_config(o.config_file);
    o.max_pred_length = 4;
    torch::manual_seed(1);
    task = std::make_unique<hetseq::test::ReadingBertTask>(o, read_loss);
    auto model = task->build_model();
    data = task->load_dataset("train");
    hetseq::optim::AdamOptions adam;
    adam.lr = 1e-3;
    auto optimizer = std::make_unique<hetseq::optim::Adam>(model->parameters(), adam);
    hetseq::optim::FixedOptions fixed;
    fixed.lrs = {1e-3};
    auto scheduler = std::make_unique<hetseq::optim::Fixed>(*optimizer, fixed);
    hetseq::ControllerOptions options;
    options.clip_norm = 0.5;
    options.precision = precision;
    controller = std::make_unique<hetseq::Controller>(*task, model, std::move(optimizer), std::move(scheduler),
                                                      std::make_shared<hetseq::LocalReducer>(), options);
  }
  TempDir dir;
  std::unique_ptr<hetseq::test::ReadingBertTask> task;
  std::shared_ptr<hetseq::Dataset> data;
  std::unique_ptr<hetseq::Controller> controller;
};

/// TinyBert: `warm` updates, then `counted` updates under an OpCounter, two micro-batches of 4 each.
Run train(hetseq::Precision precision, bool read_loss, int warm, int counted) {
  TinyBert bert(precision, read_loss);
  auto& data = bert.data;
  auto& controller = *bert.controller;
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

namespace {

/// The operators that the dispatcher runs on this thread (and on autograd's for its backward), each as its name
/// with its inputs' shapes and dtypes, from construction to destruction.
class OpSequence {
 public:
  OpSequence() {
    handle_ = at::addThreadLocalCallback(
        at::RecordFunctionCallback(
            [](const at::RecordFunction& fn) -> std::unique_ptr<at::ObserverContext> {
              if (fn.scope() != at::RecordScope::FUNCTION && fn.scope() != at::RecordScope::BACKWARD_FUNCTION) {
                return nullptr;
              }
              std::string line = fn.name();
              for (const c10::IValue& v : fn.inputs()) {
                if (!v.isTensor()) continue;
                const at::Tensor& t = v.toTensor();
                line += " " + (t.defined() ? c10::toString(t.scalar_type()) + c10::str(t.sizes()) : std::string("-"));
              }
              current()->push_back(line);
              return nullptr;
            })
            .needsInputs(true));
    current() = &ops;
  }
  ~OpSequence() {
    at::removeCallback(handle_);
    current() = nullptr;
  }
  std::vector<std::string> ops;

 private:
  static std::vector<std::string>*& current() {
    static std::vector<std::string>* ops = nullptr;
    return ops;
  }
  at::CallbackHandle handle_ = 0;
};

int64_t allocations(const std::vector<std::string>& ops) {
  int64_t n = 0;
  for (const auto& op : ops) {
    if (op.rfind("aten::empty", 0) == 0) ++n;  // empty, empty_strided, empty_like: where ATen allocates a tensor
  }
  return n;
}

}  // namespace

TEST_CASE("A steady-state update of tiny BERT runs the same operators on the same shapes every time, and allocates "
          "as many tensors",
          "[bert][train][sync]") {
  // The ground a CUDA graph stands on (Note [CUDA-graph updates]): with batches of one shape, every update after the
  // first ones must launch the same work. Three updates after two warm ones, recorded apart.
  TinyBert bert(hetseq::Precision::kFloat32, /*read_loss=*/false);
  auto& data = bert.data;
  auto& controller = *bert.controller;
  auto batch_of = [&](int u) {
    std::vector<int64_t> rows;
    for (int i = 0; i < 8; ++i) rows.push_back((u * 8 + i) % 64);
    return std::vector<Batch>{data->collate(rows)};
  };
  std::vector<std::vector<Batch>> batches;
  for (int u = 0; u < 5; ++u) batches.push_back(batch_of(u));
  std::vector<std::string> first;  // the first update's: the optimizer makes its state there
  {
    OpSequence record;
    controller.train_update(batches[0]);
    first = record.ops;
  }
  controller.train_update(batches[1]);
  std::vector<std::vector<std::string>> seen;  // [counted update] its operators
  for (int u = 2; u < 5; ++u) {
    OpSequence record;
    controller.train_update(batches[static_cast<size_t>(u)]);
    seen.push_back(record.ops);
  }
  REQUIRE(seen[0].size() > 100);
  for (size_t u = 1; u < seen.size(); ++u) {
    CAPTURE(u);
    CHECK(seen[u].size() == seen[0].size());
    const size_t n = std::min(seen[u].size(), seen[0].size());
    size_t first_difference = n;
    for (size_t i = 0; i < n; ++i) {
      if (seen[u][i] != seen[0][i]) {
        first_difference = i;
        break;
      }
    }
    INFO("first difference at operator " << first_difference << ": "
                                         << (first_difference < n ? seen[0][first_difference] + " | " +
                                                                        seen[u][first_difference]
                                                                  : std::string("none")));
    CHECK(first_difference == n);
    CHECK(allocations(seen[u]) == allocations(seen[0]));
  }
  CHECK(allocations(seen[0]) > 0);
  // The control: the record does tell updates apart (the first one allocates Adam's moments besides).
  CHECK(allocations(first) > allocations(seen[0]));
}
