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
#include "support/temp_dir.h"

using namespace hetseq;
using Catch::Matchers::Contains;

namespace {

// Points on a line, label = whether x > 0; a linear model. Nothing but what ModelTask requires.
class LineData : public Dataset {
 public:
  explicit LineData(int64_t n) : x_(torch::linspace(-1, 1, n).unsqueeze(1)), y_((x_.squeeze(1) > 0).to(torch::kLong)) {}
  int64_t size() const override { return x_.size(0); }
  Batch collate(const std::vector<int64_t>& indices) const override {
    const torch::Tensor i = torch::tensor(indices, torch::kLong);
    return {{{"x", x_.index_select(0, i)}, {"y", y_.index_select(0, i)}}, static_cast<int64_t>(indices.size())};
  }

 private:
  torch::Tensor x_, y_;
};

class LineTask : public ModelTask<torch::nn::LinearImpl> {
 public:
  std::shared_ptr<torch::nn::LinearImpl> make_model() override { return torch::nn::Linear(1, 2).ptr(); }
  std::shared_ptr<Dataset> load_dataset(const std::string& split) override {
    return std::make_shared<LineData>(split == "train" ? 40 : 10);
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
  Controller controller(task, model, std::move(optimizer), std::move(scheduler), reducer, ControllerOptions{});
  PlanSchedule schedule({4}, {{1}}, {4}, 0);  // 10 updates per epoch of 40 samples
  ValidatorOptions vopts;
  vopts.num_workers = 0;
  Validator validator(task, reducer, DataPlan::single(5, 1), vopts);
  TrainingLoopParts parts{&controller, &schedule, reducer, task.load_dataset("train"),
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
