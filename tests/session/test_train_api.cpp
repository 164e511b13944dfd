// hetseq::train: a session run from C++ with no command line, options in and a result out, for a task of
// the program's own and for a registered task by name, in one process and on 2 ranks (real processes:
// the test binary re-executes itself as each rank).
#include <catch2/catch.hpp>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "hetseq/hetseq.h"
#include "support/error_message.h"
#include "support/line_data.h"
#include "support/subprocess.h"
#include "support/temp_dir.h"

using namespace hetseq;
using Catch::Matchers::Contains;

namespace {

const Metric kCorrect{"ncorrect"};

class ApiLineTask : public ModelTask<torch::nn::LinearImpl> {
 public:
  explicit ApiLineTask(int64_t points) : points_(points) {}
  std::shared_ptr<torch::nn::LinearImpl> make_model() override { return torch::nn::Linear(1, 2).ptr(); }
  std::shared_ptr<Dataset> load_dataset(const std::string& split) override {
    return std::make_shared<test::LineData>(split == "train" ? points_ : 20);
  }
  StepOutput loss(torch::nn::LinearImpl& model, const Batch& batch) override {
    StepOutput out;
    const torch::Tensor logits = model.forward(batch.at("x"));
    out.loss = torch::nn::functional::cross_entropy(
        logits, batch.at("y"), torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum));
    out.sample_size = static_cast<double>(batch.num_samples);
    out.add(kCorrect, logits.argmax(1).eq(batch.at("y")).sum());
    return out;
  }
  std::vector<Ratio> ratios() const override { return {{"accuracy", kCorrect, metrics::kSampleSize, 100}}; }

 private:
  int64_t points_;
};

TaskSpec line_api_spec() {
  TaskSpec spec{"line_api", "which side of zero a point lies (tests/session/test_train_api.cpp)"};
  spec.flags = [](FlagSet& flags) { flags.add("points", "samples in the train split", "40", "N"); };
  spec.create = [](const FlagValues& args, const TaskContext&) {
    return std::make_unique<ApiLineTask>(args.integer("points"));
  };
  return spec;
}
HETSEQ_REGISTER_TASK(line_api, line_api_spec);

// One CPU rank, SGD at a constant rate, batches of 8, checkpoints in `save_dir`, no progress bar.
TrainOptions line_options(const std::string& save_dir, int64_t max_update) {
  TrainOptions o;
  o.common.task = "line_api";
  o.common.cpu = true;
  o.common.no_progress_bar = true;
  o.common.seed = 5;
  o.distributed.world.cpu = true;
  o.dataset.max_sentences = {8};
  o.dataset.num_workers = 0;
  o.optimization.optimizer = "sgd";
  o.optimization.lr_scheduler = "fixed";
  o.optimization.lr = {0.5};
  o.optimization.max_update = max_update;
  o.checkpoint.save.save_dir = save_dir;
  return o;
}

}  // namespace

TEST_CASE("train(): a task of one's own, options in and a result out, no command line", "[session][train_api]") {
  test::TempDir dir;
  // 40 samples in batches of 8: 5 updates an epoch; 12 updates stop inside epoch 3.
  const TrainResult result = train(line_options(dir.file("a"), 12), [](const TaskContext& context) {
    CHECK(context.device == torch::Device(torch::kCPU));
    return std::make_unique<ApiLineTask>(40);
  });
  CHECK(result.num_updates == 12);
  CHECK(result.last_epoch == 3);
  CHECK_FALSE(result.stopped);
  REQUIRE(result.valid.count("loss") == 1);
  REQUIRE(result.valid.count("accuracy") == 1);
  CHECK(result.valid.at("sample_size") == 20);
  CHECK(result.train.at("num_updates") == 12);  // epoch 3, where the limit stopped it
  // An untrained 2-class model scores about 1 bit: the loss went down, and the points are told apart.
  const TrainResult one = train(line_options(dir.file("b"), 1), [](const TaskContext&) {
    return std::make_unique<ApiLineTask>(40);
  });
  CHECK(one.num_updates == 1);
  CHECK(one.last_epoch == 1);
  CHECK(one.train.at("num_updates") == 1);  // the epoch that the limit stopped
  REQUIRE(one.valid.count("loss") == 1);
  CHECK(result.valid.at("loss") < 0.5 * one.valid.at("loss"));
  CHECK(result.valid.at("accuracy") >= 95);

  // The run saved checkpoint_last.pt: the same call again resumes at 12 updates, trains none, and says so.
  const TrainResult again = train(line_options(dir.file("a"), 12), [](const TaskContext&) {
    return std::make_unique<ApiLineTask>(40);
  });
  CHECK(again.num_updates == 12);
}

TEST_CASE("train(): a registered task by name with its flags, and the errors that name what is wrong",
          "[session][train_api]") {
  test::TempDir dir;
  TrainOptions o = line_options(dir.file("a"), 6);
  const TrainResult result = train(o, {{"points", "16"}});  // 2 updates an epoch
  CHECK(result.num_updates == 6);
  CHECK(result.last_epoch == 3);
  CHECK(result.valid.count("accuracy") == 1);

  CHECK_THAT(test::error_of<UsageError>([&] { train(o, {{"piont", "16"}}); }),
             Contains("train(): 'piont' is not a flag of the task 'line_api' (its flags: data, points)"));
  CHECK_THAT(test::error_of<UsageError>([&] { train(o, {{"points", "many"}}); }), Contains("--points"));
  o.optimization.optimizer = "adamw";
  CHECK_THAT(test::error_of<UsageError>([&] { train(o); }), Contains("adamw"));
  TrainOptions unnamed = line_options(dir.file("b"), 1);
  unnamed.common.task = "";
  CHECK_THAT(test::error_of<UsageError>([&] { train(unnamed, [](const TaskContext&) {
               return std::make_unique<ApiLineTask>(8);
             }); }),
             Contains("TrainOptions::common.task is empty"));
}

// One rank of the 2-rank test below (hidden: run by that test, in a process of its own): trains with the
// world from HETSEQ_TRAIN_API_{RANK,INIT} and writes the result to HETSEQ_TRAIN_API_OUT.
constexpr const char* kRankTest = "train(): one rank of a 2-rank run";
TEST_CASE(kRankTest, "[.][train_api_rank]") {
  const char* rank = std::getenv("HETSEQ_TRAIN_API_RANK");
  const char* init = std::getenv("HETSEQ_TRAIN_API_INIT");
  const char* out = std::getenv("HETSEQ_TRAIN_API_OUT");
  REQUIRE(rank != nullptr);
  REQUIRE(init != nullptr);
  REQUIRE(out != nullptr);
  TrainOptions o = line_options(std::string(out) + ".checkpoints", 14);
  o.distributed.world.world_size = 2;
  o.distributed.world.rank = std::stoll(rank);
  o.distributed.world.rank_given = true;
  o.distributed.world.init_method = init;
  o.dataset.max_sentences = {std::string(rank) == "0" ? int64_t{3} : int64_t{5}};  // unequal batches
  const TrainResult r = train(o, {{"points", "32"}});
  std::ofstream(out) << r.num_updates << " " << r.last_epoch << " " << r.stopped << " "
                     << fmt::format("{:.17g} {:.17g}", r.valid.at("loss"), r.valid.at("accuracy")) << "\n";
}

TEST_CASE("train(): 2 ranks in 2 processes, each calling train() with its world in the options",
          "[session][train_api]") {
  test::TempDir dir;
  std::vector<std::vector<std::string>> commands;
  std::vector<std::map<std::string, std::string>> envs;
  for (int r = 0; r < 2; ++r) {
    commands.push_back({test::binary_path("hetseq-tests"), kRankTest});
    envs.push_back({{"HETSEQ_TRAIN_API_RANK", std::to_string(r)},
                    {"HETSEQ_TRAIN_API_INIT", "file://" + dir.file("rendezvous")},
                    {"HETSEQ_TRAIN_API_OUT", dir.file("rank" + std::to_string(r))}});
  }
  const auto results = test::run_processes(commands, std::chrono::seconds(120), envs);
  std::vector<std::string> lines;
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r << " stdout:\n" << results[r].out << "\nstderr:\n" << results[r].err);
    REQUIRE_FALSE(results[r].timed_out);
    REQUIRE(results[r].exit_code == 0);
    std::ifstream in(dir.file("rank" + std::to_string(r)));
    std::string line;
    REQUIRE(std::getline(in, line));
    lines.push_back(line);
  }
  // 32 samples, 3 + 5 per update: 4 updates an epoch; 14 updates end inside epoch 4. Both ranks report
  // the same validation, to the last bit.
  CHECK(lines[0] == lines[1]);
  int64_t updates = 0, epoch = 0;
  int stopped = 1;
  double loss = 0, accuracy = 0;
  std::istringstream(lines[0]) >> updates >> epoch >> stopped >> loss >> accuracy;
  CHECK(updates == 14);
  CHECK(epoch == 4);
  CHECK(stopped == 0);
  CHECK(loss > 0);
  CHECK(loss < 0.7);  // an untrained model: above 1 bit
  CHECK(accuracy >= 90);
  CHECK_THAT(results[0].err, Contains("samples per update over 2 rank(s)"));
}
