// Updates of tiny BERT through the real task, Controller, reducer and statistics channel in a world of three
// (ranks as threads, Gloo over loopback): the host reads nothing of the device's values inside an update, on any
// rank, counted by LibTorch's own dispatcher (Note [Counting operators]): neither the task's statistics, summed
// over the ranks on the device and read after the update (Note [Stat sync]), nor the rows of the channel's round,
// which the host reads in its own memory. The path of a GPU (a host group beside the device's) is taken with a
// second Gloo group. The statistics read late are the update's: bit for bit those of the same run reading every
// value at once. The control: a task that reads its loss inside the update is counted, on every rank.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/torch.h>

#include "bert/reading_bert_task.h"
#include "bert/shard_writer.h"
#include "hetseq/channel/group_channel.h"
#include "hetseq/channel/stat_sync.h"
#include "hetseq/core/error.h"
#include "hetseq/observe/op_counter.h"
#include "hetseq/optim/adam.h"
#include "hetseq/optim/fixed.h"
#include "hetseq/reduce/ddp_reducer.h"
#include "hetseq/train/controller.h"
#include "support/rank_threads.h"
#include "support/temp_dir.h"
#include "support/test_paths.h"
#include "tasks/bert/bert_config.h"
#include "tasks/bert/bert_task.h"

using hetseq::Batch;
using hetseq::test::Group;

namespace host_reads {

constexpr int kWorld = 3;
constexpr int kWarm = 2;     // updates before the count: the names are learnt, c10d's buckets rebuilt
constexpr int kCounted = 3;  // updates counted on every rank

struct Setting {
  bool host_group = false;  // the GPU's path: the host's rows on a group of their own
  bool fast = false;        // --fast-stat-sync
  bool read_late = true;    // false: every value read at once (the reference)
  bool read_loss = false;   // the control's task
};

struct Run {
  int64_t host_reads = 0;  // over the counted updates of every rank
  int64_t ops = 0;
  std::vector<std::vector<hetseq::UpdateResult>> returned;  // [rank][counted update] as train_update returned it
  std::vector<std::vector<hetseq::UpdateResult>> complete;  // [rank][counted update] with its late values read
};

/// kWarm + kCounted updates of tiny BERT (no dropout, vocabulary cut to the shard's ids) on three ranks, each
/// with two micro-batches of 4 sequences of its own, Adam at 1e-3 and clip 0.5; the counted updates under one
/// OpCounter that every rank thread joins.
Run train(const Setting& setting) {
  hetseq::test::TempDir dir;
  hetseq::test::write_shard(dir / "tiny_train_0.hdf5", hetseq::test::make_shard(64, 16, 4));
  hetseq::bert::BertTaskOptions o;
  o.data = dir.path();
  o.config_file = hetseq::test::source_dir() + "/configs/bert-tiny.json";
  o.config = hetseq::bert::read_bert_config(o.config_file);
  o.config.vocab_size = 2112;  // the shard's ids are below 2100
  o.config.hidden_dropout_prob = 0;  // the rank threads share one generator: no draws
  o.config.attention_probs_dropout_prob = 0;
  o.max_pred_length = 4;
  // Built one after the other: the same weights on every rank.
  std::vector<std::unique_ptr<hetseq::test::ReadingBertTask>> tasks;
  std::vector<std::shared_ptr<torch::nn::Module>> models;
  std::vector<std::vector<std::vector<Batch>>> batches(kWorld);  // [rank][update][micro-batch], collated here
  for (int r = 0; r < kWorld; ++r) {
    tasks.push_back(std::make_unique<hetseq::test::ReadingBertTask>(o, setting.read_loss));
    torch::manual_seed(1);
    models.push_back(tasks.back()->build_model());
    const auto data = tasks.back()->load_dataset("train");
    for (int u = 0; u < kWarm + kCounted; ++u) {
      std::vector<Batch> micro;
      for (int k = 0; k < 2; ++k) {
        std::vector<int64_t> rows;
        for (int i = 0; i < 4; ++i) rows.push_back((u * 24 + r * 8 + k * 4 + i) % 64);
        micro.push_back(data->collate(rows));
      }
      batches[r].push_back(std::move(micro));
    }
  }
  Run run;
  run.returned.resize(kWorld);
  run.complete.resize(kWorld);
  const auto store = c10::make_intrusive<c10d::HashStore>();
  hetseq::test::OneIntraOpThread one_thread;
  hetseq::OpCounter counter;  // the rank threads join it for their counted updates; this thread only waits
  hetseq::test::run_ranks(kWorld, [&](int rank, const Group& group) {
    const Group host = setting.host_group ? hetseq::test::second_group(rank, kWorld, store, "host") : nullptr;
    auto reducer = std::make_shared<hetseq::DistributedReducer>(*models[rank], group, hetseq::test::ddp_over_group());
    auto channel = std::make_shared<hetseq::GroupChannel>(group, torch::kCPU, setting.fast, host);
    hetseq::optim::AdamOptions adam;
    adam.lr = 1e-3;
    auto optimizer = std::make_unique<hetseq::optim::Adam>(models[rank]->parameters(), adam);
    hetseq::optim::FixedOptions fixed;
    fixed.lrs = {1e-3};
    auto scheduler = std::make_unique<hetseq::optim::Fixed>(*optimizer, fixed);
    hetseq::ControllerOptions options;
    options.clip_norm = 0.5;
    options.rank = rank;
    options.read_late = setting.read_late;
    hetseq::Controller controller(*tasks[rank], models[rank], std::move(optimizer), std::move(scheduler), reducer,
                                  options, channel);
    for (int u = 0; u < kWarm; ++u) controller.train_update(batches[rank][u]);
    controller.read_late_update();
    for (int u = kWarm; u < kWarm + kCounted; ++u) {
      hetseq::UpdateResult returned;
      {
        const hetseq::OpCounter::OnThread counted(counter);
        returned = controller.train_update(batches[rank][u]);
      }
      run.returned[rank].push_back(returned);
      run.complete[rank].push_back(controller.read_late_update().value_or(returned));
    }
  });
  run.host_reads = counter.host_reads();
  run.ops = counter.ops();
  return run;
}

}  // namespace host_reads

TEST_CASE("Updates at world size 3 read nothing from the device inside them, on any rank, counted by the dispatcher",
          "[channel][stat-sync][sync]") {
  const bool fast = GENERATE(false, true);
  INFO("fast " << fast);
  // Every value read at once: the same updates' statistics and norms, and what reading costs.
  const host_reads::Run reference = host_reads::train(host_reads::Setting{false, fast, /*read_late=*/false});
  CHECK(reference.host_reads == 2 * host_reads::kWorld * host_reads::kCounted);  // the statistics and the norm
  for (const bool host_group : {false, true}) {
    INFO("host group " << host_group);
    const host_reads::Run run = host_reads::train(host_reads::Setting{host_group, fast});
    CHECK(run.host_reads == 0);
    CHECK(run.ops > 100 * host_reads::kWorld * host_reads::kCounted);  // every rank's operators were seen
    for (int r = 0; r < host_reads::kWorld; ++r) {
      INFO("rank " << r);
      for (int u = 0; u < host_reads::kCounted; ++u) {
        INFO("counted update " << u);
        const hetseq::UpdateResult& returned = run.returned[r][u];
        CHECK(returned.late);
        CHECK(returned.host_reads == 0);
        // A device value: still on the device with a host group; without one the device is this CPU, and the
        // round carried it (read at no wait).
        CHECK(returned.sums.count("loss") == (host_group ? 0u : 1u));
        CHECK(returned.sums.at("sample_size") == 8 * host_reads::kWorld);
        // Read late: bit for bit the sums and the norm read at once.
        const hetseq::UpdateResult& late = run.complete[r][u];
        const hetseq::UpdateResult& once = reference.complete[r][u];
        CHECK_FALSE(late.late);
        if (fast && host_group) {
          // Gloo's allreduce of the device's shorter row may group the three ranks' values differently: the
          // same sums to the last bits, not bit for bit (the gathered rows add in rank order, bit for bit).
          REQUIRE(late.sums.size() == once.sums.size());
          for (const auto& [name, value] : once.sums) {
            INFO(name);
            CHECK(late.sums.at(name) == Approx(value).epsilon(1e-14));
          }
        } else {
          CHECK(late.sums == once.sums);
        }
        CHECK(late.gnorm == once.gnorm);
        CHECK(late.clipped == once.clipped);
        CHECK(late.sums.at("loss") > 0);
      }
    }
  }
}

TEST_CASE("The dispatcher's count sees a host read put into an update on every rank of three",
          "[channel][stat-sync][sync]") {
  const host_reads::Run run = host_reads::train(host_reads::Setting{/*host_group=*/true, /*fast=*/false, /*read_late=*/true, /*read_loss=*/true});
  // item() of the loss, in each micro-batch of each counted update of each rank.
  CHECK(run.host_reads == 2 * host_reads::kWorld * host_reads::kCounted);
}

namespace host_reads {

/// One round's sums as a rank sees them: the host's at finish(), plus the late ones read after it.
struct Sums {
  hetseq::LogSums all;
  int64_t extra_rounds = -1;
  int64_t host_reads = -1;
  bool late = false;
};

Sums round(hetseq::StatSync& sync, const hetseq::LogSums& local, const hetseq::LogTensors& device) {
  Sums s;
  sync.start(local, device, hetseq::StatSync::kUpdate, false);
  s.all = sync.finish();
  const hetseq::LateSums late = sync.take_late();
  s.late = !late.empty();
  if (s.late) {
    const torch::Tensor rows = late.rows.contiguous();
    late.add_totals(s.all, rows.const_data_ptr<double>());
  }
  s.extra_rounds = sync.last_extra_rounds();
  s.host_reads = sync.last_host_reads();
  return s;
}

}  // namespace host_reads

TEST_CASE("With a host group, a statistic that ranks report on the host and the device, or from different places, "
          "sums the same on every rank and the collectives keep one size",
          "[channel][stat-sync]") {
  const bool fast = GENERATE(false, true);
  INFO("fast " << fast);
  constexpr int kRounds = 4;
  std::vector<std::vector<host_reads::Sums>> both(3), places(3);  // [rank][round]
  std::vector<std::string> fast_error(3);  // [rank] fast mode's error for names from different places
  const auto store = c10::make_intrusive<c10d::HashStore>();
  hetseq::test::OneIntraOpThread one_thread;
  hetseq::test::run_ranks(3, [&](int rank, const Group& group) {
    const Group host = hetseq::test::second_group(rank, 3, store, "host");
    hetseq::StatSync sync(group, torch::kCPU, fast, host);
    const auto f64 = torch::TensorOptions().dtype(torch::kFloat64);
    for (int k = 0; k < kRounds; ++k) {
      // "x": rank 0 has a host part too; "loss" on the device everywhere.
      hetseq::LogSums local{{"sample_size", 4.0}};
      if (rank == 0) local["x"] = 0.5;
      both[rank].push_back(host_reads::round(
          sync, local, {{"x", torch::full({}, 1.0 + rank + k, f64)}, {"loss", torch::full({}, 0.25 * rank, f64)}}));
    }
    for (int k = 0; k < kRounds; ++k) {
      // "y" on the host on rank 0, on the device elsewhere: the names agree, the places do not.
      hetseq::LogSums local{{"sample_size", 2.0}};
      hetseq::LogTensors device{{"loss", torch::full({}, 1.0, f64)}};
      if (rank == 0) {
        local["y"] = 10.0;
      } else {
        device["y"] = torch::full({}, 1.0 * rank, f64);
      }
      if (!fast) {
        places[rank].push_back(host_reads::round(sync, local, device));
        continue;
      }
      try {
        host_reads::round(sync, local, device);
      } catch (const hetseq::InputError& e) {
        fast_error[rank] = e.what();
      }
      break;
    }
  });
  for (int r = 0; r < 3; ++r) {
    INFO("rank " << r);
    for (int k = 0; k < kRounds; ++k) {
      INFO("round " << k);
      const host_reads::Sums& s = both[r][k];
      CHECK(s.all.at("x") == 0.5 + (1.0 + k) + (2.0 + k) + (3.0 + k));
      CHECK(s.all.at("loss") == 0.75);
      CHECK(s.all.at("sample_size") == 12);
      if (k > 0) {
        CHECK(s.late);  // the steady state: x and loss summed on the device, the host read none
        CHECK(s.extra_rounds == 0);
        CHECK(s.host_reads == 0);
      }
      if (r > 0) CHECK(s.all == both[0][k].all);
      if (fast) continue;
      // Different places: every round falls back to the serialised sums, never to collectives of different sizes.
      const host_reads::Sums& p = places[r][k];
      CHECK(p.all.at("y") == 10.0 + 1.0 + 2.0);
      CHECK(p.all.at("loss") == 3.0);
      CHECK_FALSE(p.late);
      CHECK(p.host_reads == 1);
      if (r > 0) CHECK(p.all == places[0][k].all);
    }
    // --fast-stat-sync holds every rank to the same statistics, from the same places: one error on every rank.
    if (fast) CHECK_THAT(fast_error[r], Catch::Contains("--fast-stat-sync: the ranks report different statistics"));
  }
}
