// The surface a task author meets: ModelTask (a typed model, no cast in the task), the loss logged
// without the task naming it, validation after a run that stops inside an epoch, the registry's
// handling of failed registrations, --user-dir's errors, and a typed task flag on the command line.
#include <catch2/catch.hpp>

#include <fstream>

#include "hetseq/hetseq.h"
#include "hetseq/cli/train_options.h"
#include "hetseq/optim.h"
#include "hetseq/train/training_loop.h"
#include "support/error_message.h"
#include "support/line_data.h"
#include "support/temp_dir.h"

using namespace hetseq;
using Catch::Matchers::Contains;

namespace {

// A linear model on test::LineData. Nothing but what ModelTask requires.
class LineTask : public ModelTask<torch::nn::LinearImpl> {
 public:
  std::shared_ptr<torch::nn::LinearImpl> make_model() override { return torch::nn::Linear(1, 2).ptr(); }
  std::shared_ptr<Dataset> load_dataset(const std::string& split) override {
    return std::make_shared<test::LineData>(split == "train" ? 40 : 10);
  }
  StepOutput loss(torch::nn::LinearImpl& model, const Batch& batch) override {
    StepOutput out;
    out.loss = torch::nn::functional::cross_entropy(
        model.forward(batch.at("x")), batch.at("y"),
        torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum));
    out.sample_size = static_cast<double>(batch.num_samples);
    return out;
  }
};

// Validations seen, as (epoch, num_updates).
struct Validations final : TrainingObserver {
  const Controller* controller = nullptr;
  std::vector<std::pair<int64_t, int64_t>> seen;
  std::vector<double> train_losses;  // [update] the logged sum of `loss`
  void on_update(const UpdateRecord& r) override { train_losses.push_back(r.result->sums.at("loss")); }
  void on_validation(int64_t epoch, const std::string&, const std::vector<Stat>&) override {
    seen.emplace_back(epoch, controller->num_updates());
  }
};

}  // namespace

TEST_CASE("A ModelTask's loss is logged without the task naming it, unless it logs its own", "[task]") {
  LineTask task;
  torch::manual_seed(1);
  auto model = task.build_model();
  const Batch batch = task.load_dataset("train")->collate({0, 5, 39});
  StepOutput step = task.compute_loss(*model, batch);
  LogSums sums = host_log(step);
  REQUIRE(sums.count("loss") == 1);
  CHECK(sums.at("loss") == Approx(step.loss.item<double>()).epsilon(1e-12));
  step.log_tensors["loss"] = torch::tensor(7.0);
  CHECK(host_log(step).at("loss") == 7.0);

  // A model of another class is a clear internal error, not undefined behaviour.
  torch::nn::Sequential other(torch::nn::Linear(1, 2));
  CHECK_THAT(test::error_of<InternalError>([&] { task.compute_loss(*other.ptr(), batch); }),
             Contains("got a model of another class"));
}

TEST_CASE("A run that --max-update stops inside an epoch validates after its last update, without saving",
          "[task][loop]") {
  LineTask task;
  torch::manual_seed(1);
  auto model = task.build_model();
  auto reducer = std::make_shared<LocalReducer>();
  optim::SgdOptions sgd;
  sgd.lr = 0.1;
  auto optimizer = std::make_unique<optim::Sgd>(model->parameters(), sgd);
  optim::FixedOptions fixed;
  fixed.lrs = {0.1};
  auto scheduler = std::make_unique<optim::Fixed>(*optimizer, fixed);
  ControllerOptions copts;
  copts.read_late = false;  // the observer takes every update's loss as it returns
  Controller controller(task, model, std::move(optimizer), std::move(scheduler), reducer, copts);
  PlanSchedule schedule({4}, {{1}}, {4}, 0);  // 10 updates per epoch of 40 samples
  ValidatorOptions vopts;
  vopts.num_workers = 0;
  Validator validator(task, nullptr, DataPlan::single(5, 1), vopts);
  TrainingLoopParts parts{&controller, &schedule, task.load_dataset("train"),
                          {{"valid", task.load_dataset("valid")}}, &validator, nullptr, nullptr};
  TrainingLoopOptions options;
  options.max_update = 13;  // 3 updates into epoch 2
  options.num_workers = 0;
  TrainingLoop loop(parts, options);
  auto seen = std::make_shared<Validations>();
  seen->controller = &controller;
  loop.add_observer(seen);
  loop.run(IteratorPosition{1, 0});
  CHECK(controller.num_updates() == 13);
  // After epoch 1 (update 10), and after the last update, inside epoch 2.
  CHECK(seen->seen == std::vector<std::pair<int64_t, int64_t>>{{1, 10}, {2, 13}});
  // Every update logged the loss that the task never put into its log.
  REQUIRE(seen->train_losses.size() == 13);
  for (double loss : seen->train_losses) CHECK(loss > 0);
}

TEST_CASE("A registration that fails is reported, not thrown out of a static initialiser", "[task]") {
  TaskRegistry& registry = TaskRegistry::global();
  REQUIRE(registry.contains("mnist"));
  registry.take_registration_errors();
  // What HETSEQ_REGISTER_TASK does in a library that registers a taken name.
  const hetseq::detail::TaskRegistration again{[] {
    TaskSpec spec{"mnist", "a second mnist"};
    spec.create = [](const FlagValues&, const TaskContext&) -> std::unique_ptr<Task> { return nullptr; };
    return spec;
  }};
  CHECK_THAT(test::error_of<InternalError>([&] { registry.check_registrations(); }),
             Contains("task 'mnist' registered twice"));
  CHECK(registry.take_registration_errors().empty());
  CHECK(registry.get("mnist").description != "a second mnist");
}

TEST_CASE("A task library that cannot load: --user-dir names the path and the loader's reason", "[task][cli]") {
  test::TempDir dir;
  CHECK_THAT(test::error_of<UsageError>([&] { load_user_dir(dir.path() + "/nothing-here.so"); }),
             Contains("--user-dir " + dir.path() + "/nothing-here.so: no such file or folder"));
  CHECK_THAT(test::error_of<UsageError>([&] { load_user_dir(dir.path()); }),
             Contains("the folder holds no shared library (*.so)"));
  const std::string not_elf = dir.path() + "/libbroken.so";
  std::ofstream(not_elf) << std::string(256, 'x');  // longer than an ELF header, and not one
  CHECK_THAT(test::input_error_of([&] { load_user_dir(dir.path()); }), Contains("cannot load " + not_elf + ": "));
  CHECK_THAT(test::input_error_of([&] { load_user_dir(not_elf); }), Contains("invalid ELF header"));
}

TEST_CASE("The library says its version, the one its headers declare", "[task]") {
  CHECK(std::string(version()) == HETSEQ_VERSION_STRING);
  CHECK(std::string(version()) == fmt::format("{}.{}.{}", HETSEQ_VERSION_MAJOR, HETSEQ_VERSION_MINOR,
                                              HETSEQ_VERSION_PATCH));
}

TEST_CASE("A task's flags: declared without a parser, read strictly, compared across ranks as given",
          "[task][cli]") {
  // Once per process: the registry is global, as in hetseq-train.
  static const bool registered = [] {
    TaskSpec spec{"flagged-task", "a task with flags of its own"};
    spec.flags = [](FlagSet& flags) {
      flags.add("flagged-width", "a width", "3", "N").add_optional("flagged-name", "a name").add_switch(
          "flagged-fast", "a switch");
    };
    spec.create = [](const FlagValues&, const TaskContext&) -> std::unique_ptr<Task> { return nullptr; };
    TaskRegistry::global().add(spec);
    return true;
  }();
  REQUIRE(registered);
  auto parse = [](std::vector<std::string> given) {
    std::vector<std::string> args{"hetseq-train", "--task", "flagged-task"};
    args.insert(args.end(), given.begin(), given.end());
    std::vector<const char*> argv;
    for (const auto& a : args) argv.push_back(a.c_str());
    cxxopts::Options parser = cli::make_train_parser(std::string("flagged-task"));
    const cxxopts::ParseResult parsed = cli::parse_command_line(parser, static_cast<int>(argv.size()), argv.data());
    return std::make_pair(cli::flag_values(parsed), cli::compared_flags(parser, parsed));
  };
  {
    const auto parsed = parse({});
    const FlagValues& values = parsed.first;
    const auto& compared = parsed.second;
    CHECK(values.integer("flagged-width") == 3);
    CHECK_FALSE(values.has("flagged-name"));
    CHECK_FALSE(values.flag("flagged-fast"));
    CHECK(values.text("task") == "flagged-task");
    CHECK_THAT(test::error_of<UsageError>([&] { values.text("flagged-name"); }), Contains("--flagged-name is required"));
    CHECK(compared.at("--flagged-width") == "3");
    CHECK(compared.at("--flagged-name") == "(not set)");
    CHECK(compared.at("--flagged-fast") == "false");
  }
  {
    const auto parsed = parse({"--flagged-width", "17", "--flagged-name=x", "--flagged-fast"});
    const FlagValues& values = parsed.first;
    const auto& compared = parsed.second;
    CHECK(values.integer("flagged-width") == 17);
    CHECK(values.text("flagged-name") == "x");
    CHECK(values.flag("flagged-fast"));
    CHECK(compared.at("--flagged-width") == "17");
    CHECK(compared.at("--flagged-name") == "x");
    CHECK(compared.at("--flagged-fast") == "true");
  }
  {
    const auto parsed = parse({"--flagged-width", "12x"});
    const FlagValues& values = parsed.first;
    const auto& compared = parsed.second;
    CHECK(compared.at("--flagged-width") == "12x");
    CHECK_THAT(test::error_of<UsageError>([&] { values.integer("flagged-width"); }), Contains("--flagged-width"));
  }
  // --help shows them in the task's group.
  const cxxopts::Options parser = cli::make_train_parser(std::string("flagged-task"));
  CHECK_THAT(parser.help({"flagged-task task"}), Contains("--flagged-width N") && Contains("--flagged-fast"));
}

namespace {

const Metric kHits{"hits"};    // a task's own metric, declared once
const Metric kTries{"tries"};

// A LineTask that counts its correct predictions and derives an accuracy from them.
class CountingLineTask : public LineTask {
 public:
  StepOutput loss(torch::nn::LinearImpl& model, const Batch& batch) override {
    StepOutput out = LineTask::loss(model, batch);
    out.add(kHits, model.forward(batch.at("x")).argmax(1).eq(batch.at("y")).sum());
    return out;
  }
  std::vector<Ratio> ratios() const override { return {{"accuracy", kHits, metrics::kSampleSize, 100}}; }
};

}  // namespace

TEST_CASE("Typed metrics: a step adds by metric, sums read back by metric, with the built-ins' defaults",
          "[task][task_api][metrics]") {
  static_assert(metrics::kLoss.name() == "loss" && metrics::kNllLoss.name() == "nll_loss" &&
                metrics::kSampleSize.name() == "sample_size" && metrics::kNsentences.name() == "nsentences" &&
                metrics::kNtokens.name() == "ntokens");
  StepOutput out;
  out.loss = torch::tensor(6.0);
  out.sample_size = 4;
  out.add(kHits, torch::tensor(2));  // an integer count on the device, summed in float64
  out.add(kHits, torch::tensor(1.5).reshape({1}));
  out.add(kTries, 3.0);
  out.add(kTries, 2.0);
  REQUIRE(out.log_tensors.count("hits") == 1);
  CHECK(out.log == LogSums{{"tries", 5}});
  const LogSums host = host_log(out);
  CHECK(host == LogSums{{"hits", 3.5}, {"loss", 6}, {"sample_size", 4}, {"tries", 5}});

  const MetricSums sums(host);
  CHECK(sums[kHits] == 3.5);
  CHECK(sums.get(kTries) == 5);
  CHECK(sums[metrics::kNsentences] == 4);  // default: sample_size
  CHECK(sums[metrics::kNtokens] == 4);
  CHECK(sums[metrics::kNllLoss] == 6);  // default: loss
  CHECK_FALSE(sums.has(metrics::kNllLoss));
  const LogSums with_tokens{{"loss", 6}, {"nll_loss", 2}, {"ntokens", 9}, {"sample_size", 4}};
  CHECK(MetricSums(with_tokens)[metrics::kNtokens] == 9);
  CHECK(MetricSums(with_tokens)[metrics::kNllLoss] == 2);

  // A metric no step logged, read after steps ran: an error naming it and what was logged.
  const Metric never{"nvalid"};
  CHECK(sums.get_or(never, -1) == -1);
  CHECK_THAT(test::error_of<InternalError>([&] { sums.get(never); }),
             Contains("the metric 'nvalid' was read but no step logged it (logged: hits, loss, sample_size, tries)"));
  // No step ran: every sum is 0.
  const LogSums none;
  CHECK(MetricSums(none)[never] == 0);
}

TEST_CASE("Typed metrics: what StepOutput::add refuses names the metric", "[task][task_api][metrics]") {
  StepOutput out;
  CHECK_THAT(test::error_of<InternalError>([&] { out.add(metrics::kSampleSize, 3.0); }),
             Contains("the metric 'sample_size' is StepOutput::sample_size: set that field"));
  out.add(kHits, torch::tensor(1));
  CHECK_THAT(test::error_of<InternalError>([&] { out.add(kHits, 1.0); }),
             Contains("the metric 'hits' was added both as a tensor and as a host count"));
  out.add(kTries, 1.0);
  CHECK_THAT(test::error_of<InternalError>([&] { out.add(kTries, torch::tensor(1)); }),
             Contains("the metric 'tries' was added both as a tensor and as a host count"));
  CHECK_THAT(test::error_of<InternalError>([&] { out.add(kHits, torch::ones({3})); }),
             Contains("the metric 'hits' got a tensor of 3 elements; add a 0-dim sum"));
}

TEST_CASE("Typed metrics: a task's ratios are its derived metrics, left out when the denominator is 0",
          "[task][task_api][metrics]") {
  CountingLineTask task;
  torch::manual_seed(2);
  auto model = task.build_model();
  const Batch batch = task.load_dataset("train")->collate({0, 1, 2, 37, 38, 39});
  const LogSums step = host_log(task.compute_loss(*model, batch));
  REQUIRE(step.count("hits") == 1);
  CHECK(task.derived_metrics(step) == std::map<std::string, double>{{"accuracy", 100 * step.at("hits") / 6}});
  CHECK(task.derived_metrics(LogSums{{"hits", 3}, {"sample_size", 4}}).at("accuracy") == 75);
  CHECK(task.derived_metrics(LogSums{{"hits", 0}, {"sample_size", 0}}).empty());
  CHECK(task.derived_metrics(LogSums{}).empty());
  // The default task derives nothing; evaluate() applies a factor after the division's operands.
  CHECK(LineTask().derived_metrics(step).empty());
  const LogSums sums{{"hits", 1}, {"tries", 8}, {"sample_size", 2}};
  CHECK(evaluate({{"per_try", kHits, kTries, 2}, {"none", kHits, metrics::kNtokens, 1}}, sums) ==
        std::map<std::string, double>{{"none", 0.5}, {"per_try", 0.25}});
}
