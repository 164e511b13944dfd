// The training loop with ranks as threads (each with its own Gloo group), against one process that
// trains on the same samples per update: a split changed in the middle of an epoch, and a short last
// step whose micro-batches are partly empty. Dropout is off, so the runs must agree to rounding.
#include <catch2/catch.hpp>

#include <map>
#include <set>

#include "hetseq/reduce/ddp_reducer.h"
#include "hetseq/channel/group_channel.h"
#include "hetseq/optim.h"
#include "hetseq/train/training_loop.h"
#include "support/mnist_files.h"
#include "support/rank_threads.h"
#include "support/temp_dir.h"
#include "tasks/mnist/mnist_task.h"

using namespace hetseq;

namespace {

// Records, per update, the mean loss over all ranks and this rank's sample ids.
struct Recorder final : TrainingObserver {
  std::vector<double> losses;              // [update]
  std::vector<std::vector<int64_t>> ids;   // [update][sample]
  std::vector<std::vector<int64_t>> batch_sizes;  // [update][rank]
  void on_update(const UpdateRecord& r) override {
    batch_sizes.push_back(r.batch_sizes);
    losses.push_back(r.result->sums.at("loss") / r.result->sums.at("sample_size"));
    std::vector<int64_t> all;
    for (const auto& mb : *r.sample_ids) all.insert(all.end(), mb.begin(), mb.end());
    ids.push_back(all);
  }
};

using Split = std::pair<std::vector<int64_t>, std::vector<int64_t>>;  // batch sizes, update-freqs [rank]

// Changes the split after the given update counts (the same on every rank, as a balancer would).
struct Resplit final : TrainingObserver {
  PlanSchedule& schedule;
  std::map<int64_t, Split> at;  // [update count after which] split
  Resplit(PlanSchedule& s, std::map<int64_t, Split> a) : schedule(s), at(std::move(a)) {}
  void on_update(const UpdateRecord& r) override {
    if (auto it = at.find(r.num_updates); it != at.end()) schedule.set_split(r.epoch, it->second.first, it->second.second);
  }
};

struct RankRun {
  std::vector<double> losses;
  std::vector<std::vector<int64_t>> ids;
  std::vector<std::vector<int64_t>> batch_sizes;
  std::vector<torch::Tensor> params;
};

// One rank (or the single process, with a null group) training one epoch with SGD.
RankRun train_one_epoch(mnist::MnistTask& task, std::shared_ptr<torch::nn::Module> model, const Split& plan,
                        int64_t rank, const test::Group& group, const std::map<int64_t, Split>& resplits) {
  std::shared_ptr<GradientReducer> reducer = std::make_shared<LocalReducer>();
  std::shared_ptr<CollectiveChannel> channel = std::make_shared<LocalChannel>();
  if (group) {
    reducer = std::make_shared<DistributedReducer>(*model, group, DdpOptions{});
    channel = std::make_shared<GroupChannel>(group, torch::kCPU, false);
  }
  std::vector<std::vector<int64_t>> freqs;
  for (int64_t u : plan.second) freqs.push_back({u});
  PlanSchedule schedule(plan.first, freqs, plan.first, rank);
  optim::SgdOptions sgd;
  sgd.lr = 0.05;
  auto optimizer = std::make_unique<optim::Sgd>(model->parameters(), sgd);
  optim::FixedOptions fixed;
  fixed.lrs = {0.05};
  auto scheduler = std::make_unique<optim::Fixed>(*optimizer, fixed);
  ControllerOptions copts;
  copts.read_late = false;  // the recorder takes every update's loss as it returns
  copts.clip_norm = 0;
  copts.rank = rank;
  Controller controller(task, model, std::move(optimizer), std::move(scheduler), reducer, copts, channel);
  TrainingLoopParts parts{&controller, &schedule, task.load_dataset("train"), {}, nullptr, nullptr};
  TrainingLoopOptions options;
  options.max_epoch = 1;
  options.disable_validation = true;
  options.num_workers = 0;
  TrainingLoop loop(parts, options);
  auto recorder = std::make_shared<Recorder>();
  loop.add_observer(std::make_shared<Resplit>(schedule, resplits));
  loop.add_observer(recorder);
  loop.run(IteratorPosition{1, 0});
  RankRun out{recorder->losses, recorder->ids, recorder->batch_sizes, {}};
  for (const auto& p : model->parameters()) out.params.push_back(p.detach().clone());
  return out;
}

// `world` ranks as threads with `plan` (changed by `resplits`) against one process with all samples of
// each update; checks per-update losses, each update's samples and the final parameters.
// `splits` [update] is the split each update must have run with.
void check_against_one_process(int64_t train_samples, const Split& plan, const std::map<int64_t, Split>& resplits,
                               const std::vector<Split>& splits) {
  test::OneIntraOpThread one_thread;
  test::TempDir dir;
  test::write_random_mnist(dir.path(), train_samples, 10);
  mnist::MnistTaskOptions topts;
  topts.data_dir = dir.path();
  topts.model.dropout1 = topts.model.dropout2 = 0;
  topts.model.hidden = 16;
  mnist::MnistTask task(topts);
  const int world = static_cast<int>(plan.first.size());
  int64_t per_update = 0;
  for (int r = 0; r < world; ++r) per_update += plan.first[r] * plan.second[r];
  std::vector<std::shared_ptr<torch::nn::Module>> models;  // [rank], then the single process's
  for (int r = 0; r <= world; ++r) {
    torch::manual_seed(3);
    models.push_back(task.build_model());
  }
  const RankRun single = train_one_epoch(task, models[world], Split{{per_update}, {1}}, 0, nullptr, {});
  std::vector<RankRun> runs(world);
  test::run_ranks(world, [&](int r, const test::Group& group) {
    runs[r] = train_one_epoch(task, models[r], plan, r, group, resplits);
  });
  const size_t updates = single.losses.size();
  REQUIRE(updates == static_cast<size_t>((train_samples + per_update - 1) / per_update));
  std::multiset<int64_t> seen;
  for (size_t k = 0; k < updates; ++k) {
    std::vector<int64_t> step;
    for (const auto& run : runs) {
      REQUIRE(run.losses.size() == updates);
      CHECK(run.losses[k] == Approx(single.losses[k]).epsilon(1e-5));
      step.insert(step.end(), run.ids[k].begin(), run.ids[k].end());
      CHECK(run.batch_sizes[k] == splits[k].first);
    }
    for (int r = 0; r < world && k + 1 < updates; ++r) {
      // A full update: each rank took exactly its share of the split in force.
      CHECK(runs[r].ids[k].size() == static_cast<size_t>(splits[k].first[r] * splits[k].second[r]));
    }
    std::vector<int64_t> expected = single.ids[k];
    std::sort(step.begin(), step.end());
    std::sort(expected.begin(), expected.end());
    CHECK(step == expected);
    seen.insert(step.begin(), step.end());
  }
  CHECK(seen.size() == static_cast<size_t>(train_samples));
  CHECK(std::set<int64_t>(seen.begin(), seen.end()).size() == static_cast<size_t>(train_samples));
  for (const auto& run : runs) {
    for (size_t i = 0; i < run.params.size(); ++i) {
      CHECK(torch::allclose(run.params[i], single.params[i], 1e-4, 1e-6));
    }
  }
}

}  // namespace

TEST_CASE("Training loop: the split changes twice mid-epoch and the losses follow one process", "[loop]") {
  // 2 ranks, 6 + 2x5 = 16 samples per update, 96 samples: 6 updates; new splits after updates 2 and 4.
  const Split first{{6, 5}, {1, 2}}, second{{12, 2}, {1, 2}}, third{{2, 4}, {4, 2}};
  check_against_one_process(96, first, {{2, second}, {4, third}}, {first, first, second, second, third, third});
}

TEST_CASE("Training loop: a short last step with empty micro-batches follows one process", "[loop]") {
  // 16 samples per update over 84: the 6th update has 4 samples, all on rank 0; both micro-batches of
  // rank 1 are empty, and rank 0's is short.
  const Split plan{{8, 4}, {1, 2}};
  check_against_one_process(84, plan, {}, std::vector<Split>(6, plan));
}
