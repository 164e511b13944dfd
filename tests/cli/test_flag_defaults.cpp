// Every general flag's default is its options struct's default (Note [One declaration per flag]): an
// hetseq-train command line that gives only what it must is read into the same structs as a program
// that default-constructs them (hetseq::train), field by field. A default changed on one side only fails
// here.
#include <catch2/catch.hpp>

#include "hetseq/cli/train_options.h"
#include "hetseq/optim/adadelta.h"
#include "hetseq/optim/adam.h"
#include "hetseq/optim/common_optim_flags.h"
#include "hetseq/optim/inverse_sqrt.h"
#include "hetseq/optim/registry.h"
#include "hetseq/optim/sgd.h"
#include "hetseq/task/task_registry.h"

using namespace hetseq;

namespace {

// A task that sets no defaults for general flags, so that the parsed values are the general ones.
const std::string kTask = "flag-defaults-task";

void register_task_once() {
  static const bool registered = [] {
    TaskSpec spec{kTask, "a task without defaults of its own, for the defaults test"};
    spec.create = [](const FlagValues&, const TaskContext&) -> std::unique_ptr<Task> { return nullptr; };
    TaskRegistry::global().add(spec);
    return true;
  }();
  REQUIRE(registered);
}

FlagValues parse(std::vector<std::string> given, const std::optional<std::string>& task) {
  std::vector<std::string> args{"hetseq-train"};
  args.insert(args.end(), given.begin(), given.end());
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  cxxopts::Options parser = cli::make_train_parser(task);
  return cli::flag_values(cli::parse_command_line(parser, static_cast<int>(argv.size()), argv.data()));
}

}  // namespace

#define SAME(field) CHECK(got.field == want.field)

TEST_CASE("every general flag's default is its options struct's default", "[cli][flags]") {
  register_task_once();
  const FlagValues values = parse({"--task", kTask, "--max-sentences", "8"}, kTask);
  const TrainOptions got = cli::read_train_options(values);
  TrainOptions want;
  want.common.task = kTask;        // given
  want.dataset.max_sentences = {8};  // given: required, no default

  SAME(common.task);
  SAME(common.seed);
  SAME(common.cpu);
  SAME(common.no_progress_bar);
  SAME(common.log_interval);
  SAME(common.log_format);
  SAME(common.intra_op_threads);
  SAME(common.deterministic);
  SAME(common.cuda_graph);

  SAME(mixed_precision.precision);
  SAME(mixed_precision.scaler.init_scale);
  SAME(mixed_precision.scaler.scale_window);
  SAME(mixed_precision.scaler.tolerance);
  SAME(mixed_precision.scaler.min_scale);
  SAME(mixed_precision.scaler.threshold);
  SAME(mixed_precision.scale_window);

  SAME(dataset.num_workers);
  SAME(dataset.max_sentences);
  SAME(dataset.max_sentences_valid);
  SAME(dataset.required_batch_size_multiple);
  SAME(dataset.train_subset);
  SAME(dataset.valid_subsets);
  SAME(dataset.validate_interval);
  SAME(dataset.disable_validation);
  SAME(dataset.curriculum);

  SAME(optimization.max_epoch);
  SAME(optimization.max_update);
  SAME(optimization.clip_norm);
  SAME(optimization.update_freq);
  SAME(optimization.lr);
  SAME(optimization.min_lr);
  SAME(optimization.optimizer);
  SAME(optimization.lr_scheduler);
  CHECK(got.optimization.make_optimizer);      // configured from the flags; the struct's is empty until
  CHECK(got.optimization.make_lr_scheduler);   // train() configures it from the same defaults

  const optim::CommonOptimOptions got_common = optim::read_common_optim_options(values, {});
  const optim::CommonOptimOptions want_common;
  CHECK(got_common.weight_decay == want_common.weight_decay);
  CHECK(got_common.warmup_updates == want_common.warmup_updates);
  CHECK(got_common.force_anneal == want_common.force_anneal);

  SAME(distributed.world.init_method);
  SAME(distributed.world.world_size);
  SAME(distributed.world.rank);
  SAME(distributed.world.rank_given);
  SAME(distributed.world.device_id);
  SAME(distributed.world.cpu);
  SAME(distributed.world.backend);
  SAME(distributed.world.timeout);
  SAME(distributed.world.rendezvous_timeout);
  SAME(distributed.world.checkpoint_timeout);
  SAME(distributed.world.debug_collectives);
  SAME(distributed.gpus);
  SAME(distributed.no_spawn);
  SAME(distributed.ddp.bucket_cap_mb);
  SAME(distributed.ddp.find_unused_parameters);
  SAME(distributed.ddp.broadcast_buffers);
  SAME(distributed.ddp.comm_hook);
  SAME(distributed.ddp.powersgd.rank);
  SAME(distributed.ddp.powersgd.start_update);
  SAME(distributed.ddp.powersgd.min_compression_rate);
  SAME(distributed.ddp.powersgd.seed);
  SAME(distributed.ddp.shared_memory);
  SAME(distributed.ddp.shared_memory_timeout);
  SAME(distributed.ddp.initial_buckets);
  SAME(distributed.fast_stat_sync);
  SAME(distributed.log_all_ranks);
  SAME(distributed.zero_sharding);
  SAME(distributed.memory_budget_bytes);

  SAME(balance.auto_balance);
  SAME(balance.interval);
  SAME(balance.threshold);
  SAME(balance.threshold_given);
  SAME(balance.caps);

  SAME(observe.trace_dir);
  SAME(observe.trace_first);
  SAME(observe.trace_last);
  SAME(observe.trace_ops);
  SAME(observe.step_profile_warmup);
  SAME(observe.step_profile_timed);
  SAME(observe.tensorboard_logdir);
  SAME(observe.json_log);

  SAME(checkpoint.save.save_dir);
  SAME(checkpoint.save.no_save);
  SAME(checkpoint.save.save_interval);
  SAME(checkpoint.save.save_interval_updates);
  SAME(checkpoint.save.keep_interval_updates);
  SAME(checkpoint.save.keep_last_epochs);
  SAME(checkpoint.save.no_epoch_checkpoints);
  SAME(checkpoint.save.no_last_checkpoints);
  SAME(checkpoint.save.no_save_optimizer_state);
  SAME(checkpoint.save.best_checkpoint_metric);
  SAME(checkpoint.save.maximize_best_checkpoint_metric);
  SAME(checkpoint.restore_file);
  SAME(checkpoint.restore_file_given);
  SAME(checkpoint.reset_dataloader);
  SAME(checkpoint.reset_lr_scheduler);
  SAME(checkpoint.reset_meters);
  SAME(checkpoint.reset_optimizer);
  SAME(checkpoint.optimizer_overrides);
  SAME(checkpoint.dump_sample_ids);
}

#undef SAME

TEST_CASE("every optimizer's flags default to its options struct's defaults", "[cli][flags]") {
  register_task_once();
  const FlagValues values = parse({"--task", kTask, "--max-sentences", "8"}, kTask);
  const optim::CommonOptimOptions common = optim::read_common_optim_options(values, {0.5});
  // The optimizer that --optimizer NAME builds from these values, over one parameter.
  auto built = [&](const std::string& name) {
    return optim::optimizers().get(name).configure(values, common)({torch::zeros({2}, torch::requires_grad())});
  };
  {
    const auto optimizer = built("adam");
    const auto* adam = dynamic_cast<const optim::Adam*>(optimizer.get());
    REQUIRE(adam != nullptr);
    const optim::AdamOptions want;
    CHECK(adam->options().beta1 == want.beta1);
    CHECK(adam->options().beta2 == want.beta2);
    CHECK(adam->options().eps == want.eps);
    CHECK(adam->options().weight_decay == want.weight_decay);
  }
  {
    const auto optimizer = built("adadelta");
    const auto* adadelta = dynamic_cast<const optim::Adadelta*>(optimizer.get());
    REQUIRE(adadelta != nullptr);
    const optim::AdadeltaOptions want;
    CHECK(adadelta->options().rho == want.rho);
    CHECK(adadelta->options().eps == want.eps);
    CHECK(adadelta->options().weight_decay == want.weight_decay);
  }
  {
    const auto optimizer = built("sgd");
    const auto* sgd = dynamic_cast<const optim::Sgd*>(optimizer.get());
    REQUIRE(sgd != nullptr);
    const optim::SgdOptions want;
    CHECK(sgd->options().momentum == want.momentum);
    CHECK(sgd->options().weight_decay == want.weight_decay);
  }
}

TEST_CASE("every schedule's --warmup-updates is its options struct's default unless given", "[cli][flags]") {
  register_task_once();
  // The learning rate that --lr_scheduler NAME sets at update `n` with lr 1e-3, from these flags.
  auto lr_at = [](const std::vector<std::string>& flags, const std::string& name, int64_t n) {
    std::vector<std::string> args{"--task", kTask, "--max-sentences", "8", "--lr_scheduler", name, "--lr", "0.001"};
    args.insert(args.end(), flags.begin(), flags.end());
    const FlagValues values = parse(args, kTask);
    const optim::CommonOptimOptions common = optim::read_common_optim_options(values, {1e-3});
    auto sgd = optim::optimizers().get("sgd").configure(values, common)({torch::zeros({2}, torch::requires_grad())});
    auto schedule = optim::lr_schedulers().get(name).configure(values, common)(*sgd);
    return schedule->step_update(n);
  };
  // inverse_sqrt: half way through its own default warmup (4000, fairseq's), half the rate.
  const int64_t warmup = optim::InverseSqrtOptions{}.warmup_updates;
  CHECK(lr_at({}, "inverse_sqrt", warmup / 2) == Approx(0.5e-3));
  CHECK(lr_at({"--warmup-updates", "10"}, "inverse_sqrt", 5) == Approx(0.5e-3));
  // fixed: no warmup unless given (the flag's default, CommonOptimOptions).
  CHECK(optim::CommonOptimOptions{}.warmup_updates == 0);
  CHECK(lr_at({}, "fixed", 0) == Approx(1e-3));
  CHECK(lr_at({"--warmup-updates", "10"}, "fixed", 4) == Approx(0.5e-3));
}

TEST_CASE("a task's defaults for general flags replace the structs' defaults, and flags given win", "[cli][flags]") {
  // MNIST's recipe: Adadelta, lr 1.01, clip-norm 100, valid-subset test (tasks/mnist/mnist_task.cpp).
  const TrainOptions mnist = cli::read_train_options(parse({"--task", "mnist", "--max-sentences", "8"}, "mnist"));
  CHECK(mnist.optimization.optimizer == "adadelta");
  CHECK(mnist.optimization.lr == std::vector<double>{1.01});
  CHECK(mnist.optimization.clip_norm == 100);
  CHECK(mnist.dataset.valid_subsets == std::vector<std::string>{"test"});
  CHECK(mnist.distributed.ddp.bucket_cap_mb == DdpOptions{}.bucket_cap_mb);  // a flag it leaves alone
  const TrainOptions given =
      cli::read_train_options(parse({"--task", "mnist", "--max-sentences", "8", "--clip-norm", "3"}, "mnist"));
  CHECK(given.optimization.clip_norm == 3);
}

TEST_CASE("a default switch can be turned off, and what was given is told from what was defaulted", "[cli][flags]") {
  register_task_once();
  const FlagValues defaulted = parse({"--task", kTask, "--max-sentences", "8"}, kTask);
  CHECK(defaulted.flag("broadcast-buffers"));
  CHECK_FALSE(defaulted.given("broadcast-buffers"));
  CHECK_FALSE(defaulted.given("restore-file"));
  const FlagValues given = parse(
      {"--task", kTask, "--max-sentences", "8", "--broadcast-buffers=false", "--restore-file", "a.pt"}, kTask);
  CHECK_FALSE(given.flag("broadcast-buffers"));
  CHECK(given.given("broadcast-buffers"));
  const TrainOptions o = cli::read_train_options(given);
  CHECK_FALSE(o.distributed.ddp.broadcast_buffers);
  CHECK(o.checkpoint.restore_file_given);
}
