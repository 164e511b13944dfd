// PowerSGD gradient compression with ranks as threads in one process, each with its own Gloo process
// group (level 1 of STYLE's test levels; see support/rank_threads.h). See Note [PowerSGD].
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <functional>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "hetseq/checkpoint/checkpoint_file.h"
#include "hetseq/core/error.h"
#include "hetseq/core/logging.h"
#include "hetseq/reduce/powersgd.h"
#include "support/error_message.h"
#include "support/tensor_lists.h"
#include "support/rank_threads.h"
#include "support/temp_dir.h"

using hetseq::PowerSgd;
using hetseq::PowerSgdOptions;

namespace {

using hetseq::test::Group;
using hetseq::test::is_a;
using hetseq::test::message_of;
using hetseq::test::OneIntraOpThread;
using hetseq::test::run_ranks;
using hetseq::test::run_ranks_collect;

// PowerSGD that compresses from the first update: the library's default reduces the first 100 updates
// uncompressed (PowerSgdOptions::start_update), and these tests look at the compression itself.
PowerSgdOptions compressing() {
  PowerSgdOptions options;
  options.start_update = 0;
  return options;
}

using Shapes = std::vector<std::vector<int64_t>>;
using Views = std::vector<torch::Tensor>;  // [view] one value per gradient view of a bucket

// A bucket as c10d::Reducer lays it out: one flat float32 buffer, each gradient a view into it. With
// `transposed`, view `transposed` is a non-contiguous (transposed) view, as a channels-last parameter's.
struct Bucket {
  torch::Tensor buffer;
  Views grads;
};

Bucket make_bucket(const Shapes& shapes, int64_t transposed = -1) {
  int64_t total = 0;
  for (const auto& s : shapes) total += c10::multiply_integers(s);
  Bucket b{torch::zeros({total}), {}};
  int64_t offset = 0;
  for (size_t i = 0; i < shapes.size(); ++i) {
    const auto& s = shapes[i];
    const int64_t numel = c10::multiply_integers(s);
    torch::Tensor flat = b.buffer.narrow(0, offset, numel);
    if (static_cast<int64_t>(i) == transposed) {
      b.grads.push_back(flat.view({s[1], s[0]}).t());
    } else {
      b.grads.push_back(flat.view(s));
    }
    offset += numel;
  }
  return b;
}

// Random values for the views of `shapes` (float64, exactly representable in float32), from the
// global generator: only the main thread calls it.
Views random_views(const Shapes& shapes) {
  Views out;
  for (const auto& s : shapes) out.push_back(torch::randn(s, torch::kFloat64).to(torch::kFloat32).to(torch::kFloat64));
  return out;
}

Views sum_over_ranks(const std::vector<Views>& per_rank) {  // per_rank: [rank][view]
  Views sum;
  for (const auto& v : per_rank[0]) sum.push_back(torch::zeros_like(v));
  for (const auto& views : per_rank) {
    for (size_t i = 0; i < views.size(); ++i) sum[i] += views[i];
  }
  return sum;
}

// Writes `values` into the bucket's views, reduces it and returns copies of the views (float64).
// Checks that the future's value is the one-element list holding the buffer.
Views reduce(PowerSgd& psgd, int64_t index, Bucket& bucket, const Views& values) {
  for (size_t i = 0; i < values.size(); ++i) bucket.grads[i].copy_(values[i]);
  auto future = psgd.reduce(index, bucket.buffer, bucket.grads);
  future->waitAndThrow();
  const auto result = future->value().toTensorVector();
  if (result.size() != 1 || !result[0].is_same(bucket.buffer)) {
    throw std::runtime_error("the future's value is not the list [buffer]");
  }
  Views out;
  for (const auto& g : bucket.grads) out.push_back(g.to(torch::kFloat64));
  return out;
}

// Largest |a - b| over all views, relative to the largest |b|.
double rel_diff(const Views& a, const Views& b) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, (a[i] - b[i]).abs().max().item<double>());
    scale = std::max(scale, b[i].abs().max().item<double>());
  }
  return diff / scale;
}

bool all_finite(const Views& views) {
  for (const auto& v : views) {
    if (!torch::isfinite(v).all().item<bool>()) return false;
  }
  return true;
}

double frobenius(const Views& views) {
  double sq = 0;
  for (const auto& v : views) sq += v.pow(2).sum().item<double>();
  return std::sqrt(sq);
}

}  // namespace

TEST_CASE("PowerSGD at full rank gives the exact sum over 3 ranks for every bucket of an update",
          "[distributed][powersgd]") {
  OneIntraOpThread one_thread;
  constexpr int kWorld = 3;
  constexpr int kUpdates = 3;
  // Per bucket: matrices (one 3-D, read as 3 x 10; one a transposed, non-contiguous view), a vector.
  const std::vector<Shapes> shapes{{{6, 4}, {3, 5, 2}, {7}, {2, 2}}, {{5}, {9, 3}}, {{4, 8}}};
  const std::vector<int64_t> transposed{-1, 1, 0};  // [bucket] its transposed view
  torch::manual_seed(1);
  std::vector<std::vector<std::vector<Views>>> inputs(kUpdates);  // [update][bucket][rank]
  for (auto& update : inputs) {
    for (const auto& s : shapes) {
      update.emplace_back();
      for (int r = 0; r < kWorld; ++r) update.back().push_back(random_views(s));
    }
  }
  std::vector<std::vector<std::vector<Views>>> outputs(kWorld);  // [rank][update][bucket]
  run_ranks(kWorld, [&](int rank, const Group& group) {
    PowerSgdOptions options = compressing();
    options.rank = 10;                  // >= min(n, m) of every matrix
    options.min_compression_rate = 0;   // compress even where it saves nothing
    PowerSgd psgd(group, options);
    std::vector<Bucket> buckets;
    for (size_t b = 0; b < shapes.size(); ++b) buckets.push_back(make_bucket(shapes[b], transposed[b]));
    for (int u = 0; u < kUpdates; ++u) {
      psgd.begin_update();
      // Every bucket is started before any is waited for, as the reducer does during backward.
      std::vector<c10::intrusive_ptr<c10::ivalue::Future>> futures;
      for (size_t b = 0; b < shapes.size(); ++b) {
        for (size_t i = 0; i < shapes[b].size(); ++i) buckets[b].grads[i].copy_(inputs[u][b][rank][i]);
        futures.push_back(psgd.reduce(static_cast<int64_t>(b), buckets[b].buffer, buckets[b].grads));
      }
      outputs[rank].emplace_back();
      for (size_t b = 0; b < shapes.size(); ++b) {
        futures[b]->waitAndThrow();
        Views out;
        for (const auto& g : buckets[b].grads) out.push_back(g.to(torch::kFloat64));
        outputs[rank][u].push_back(out);
      }
    }
  });
  for (int u = 0; u < kUpdates; ++u) {
    for (size_t b = 0; b < shapes.size(); ++b) {
      CAPTURE(u, b);
      const Views exact = sum_over_ranks(inputs[u][b]);
      CHECK(rel_diff(outputs[0][u][b], exact) < 1e-4);
      for (int r = 1; r < kWorld; ++r) CHECK(hetseq::test::all_equal(outputs[r][u][b], outputs[0][u][b]));
    }
  }
}

TEST_CASE("PowerSGD at rank 1 is one power iteration of the sum from the initial Q", "[distributed][powersgd]") {
  OneIntraOpThread one_thread;
  constexpr int kWorld = 3;
  constexpr int64_t kBucket = 2;
  const Shapes shapes{{5}, {8, 5}};  // (8 + 5) * 1 * 2 <= 40: the matrix is compressed
  PowerSgdOptions options = compressing();
  options.seed = 17;
  torch::manual_seed(2);
  std::vector<Views> inputs;  // [rank]
  for (int r = 0; r < kWorld; ++r) inputs.push_back(random_views(shapes));
  std::vector<Views> outputs(kWorld);  // [rank]
  run_ranks(kWorld, [&](int rank, const Group& group) {
    PowerSgd psgd(group, options);
    psgd.begin_update();
    Bucket bucket = make_bucket(shapes);
    outputs[rank] = reduce(psgd, kBucket, bucket, inputs[rank]);
  });

  // The reference, in float64: P = S Q0, p = P / |P|, approximation p (S^T p)^T.
  const Views exact = sum_over_ranks(inputs);
  const torch::Tensor q0 = hetseq::detail::powersgd_initial_q(options.seed, kBucket, 1, 5, 1).to(torch::kFloat64);
  REQUIRE(q0.sizes().vec() == std::vector<int64_t>{5, 1});
  CHECK(q0.norm().item<double>() == Approx(1).epsilon(1e-6));
  torch::Tensor p = exact[1].mm(q0);
  p /= p.norm();
  const torch::Tensor reference = p.mm(exact[1].t().mm(p).t());
  CHECK(rel_diff({outputs[0][1]}, {reference}) < 1e-4);
  CHECK(rel_diff({outputs[0][1]}, {exact[1]}) > 0.1);  // a rank-1 approximation, not the sum
  CHECK(rel_diff({outputs[0][0]}, {exact[0]}) < 1e-6);  // the vector is summed exactly
  for (int r = 1; r < kWorld; ++r) CHECK(hetseq::test::all_equal(outputs[r], outputs[0]));
  // The initial Q depends on the seed, the bucket and the view, and on nothing else.
  CHECK(hetseq::detail::powersgd_initial_q(options.seed, kBucket, 1, 5, 1).equal(q0.to(torch::kFloat32)));
  CHECK_FALSE(hetseq::detail::powersgd_initial_q(options.seed + 1, kBucket, 1, 5, 1).equal(q0.to(torch::kFloat32)));
  CHECK_FALSE(hetseq::detail::powersgd_initial_q(options.seed, kBucket + 1, 1, 5, 1).equal(q0.to(torch::kFloat32)));
}

TEST_CASE("PowerSGD error feedback keeps the running sum of the results near the running exact sum",
          "[distributed][powersgd]") {
  OneIntraOpThread one_thread;
  constexpr int kWorld = 2;
  constexpr int kCalls = 60;
  const Shapes shapes{{16, 12}};
  torch::manual_seed(3);
  std::vector<Views> inputs;  // [rank] the same every update
  for (int r = 0; r < kWorld; ++r) inputs.push_back(random_views(shapes));
  std::vector<std::vector<Views>> outputs(kWorld);  // [rank][call]
  run_ranks(kWorld, [&](int rank, const Group& group) {
    PowerSgd psgd(group, compressing());
    Bucket bucket = make_bucket(shapes);
    for (int c = 0; c < kCalls; ++c) {
      psgd.begin_update();
      outputs[rank].push_back(reduce(psgd, 0, bucket, inputs[rank]));
    }
  });
  const torch::Tensor exact = sum_over_ranks(inputs)[0];
  const double first_residual = (exact - outputs[0][0][0]).norm().item<double>();  // what each call leaves out
  REQUIRE(first_residual > 0.1 * exact.norm().item<double>());
  // The difference of the running sums is the total error of the ranks. Without error feedback it grows by
  // about first_residual per call; with it, it grows while the error builds up in the directions that
  // the rank-1 approximations left out, until those dominate and get sent, then stays bounded (about 8
  // first_residual for this matrix, over hundreds of calls).
  torch::Tensor running = torch::zeros_like(exact);
  double worst_first_half = 0, worst_second_half = 0;
  for (int c = 0; c < kCalls; ++c) {
    running += outputs[0][c][0] - exact;
    double& worst = c < kCalls / 2 ? worst_first_half : worst_second_half;
    worst = std::max(worst, running.norm().item<double>());
  }
  CAPTURE(first_residual, worst_first_half, worst_second_half);
  CHECK(worst_second_half < 0.25 * kCalls * first_residual);
  CHECK(worst_second_half < 1.5 * worst_first_half);
  for (int c = 0; c < kCalls; ++c) CHECK(hetseq::test::all_equal(outputs[1][c], outputs[0][c]));
}

TEST_CASE("PowerSGD before start_update is the exact sum and leaves the compression state untouched",
          "[distributed][powersgd]") {
  OneIntraOpThread one_thread;
  constexpr int kWorld = 2;
  const Shapes shapes{{10, 6}, {6}};
  torch::manual_seed(4);
  std::vector<Views> inputs;  // [rank], integers: their float32 sum is exact in any order
  for (int r = 0; r < kWorld; ++r) {
    Views views;
    for (const auto& s : shapes) views.push_back(torch::randint(-50, 50, s, torch::kFloat64));
    inputs.push_back(views);
  }
  std::vector<std::vector<Views>> outputs(kWorld);  // [rank][update]
  std::vector<Views> fresh(kWorld);                 // [rank] a new PowerSgd's first compressed result
  run_ranks(kWorld, [&](int rank, const Group& group) {
    PowerSgdOptions options = compressing();
    options.start_update = 2;
    PowerSgd psgd(group, options);
    Bucket bucket = make_bucket(shapes);
    for (int u = 0; u < 3; ++u) {
      psgd.begin_update();
      outputs[rank].push_back(reduce(psgd, 0, bucket, inputs[rank]));
    }
    PowerSgd other(group, compressing());
    other.begin_update();
    fresh[rank] = reduce(other, 0, bucket, inputs[rank]);
  });
  const Views exact = sum_over_ranks(inputs);
  for (int r = 0; r < kWorld; ++r) {
    CAPTURE(r);
    CHECK(hetseq::test::all_equal(outputs[r][0], exact));
    CHECK(hetseq::test::all_equal(outputs[r][1], exact));
    CHECK_FALSE(hetseq::test::all_equal(outputs[r][2], exact));  // update 2 is compressed ...
    CHECK(hetseq::test::all_equal(outputs[r][2], fresh[r]));     // ... as if the warm-up had not been
  }
}

TEST_CASE("PowerSGD: a non-finite gradient on one rank is non-finite on all and does not poison later updates",
          "[distributed][powersgd]") {
  OneIntraOpThread one_thread;
  constexpr int kWorld = 2;
  const Shapes shapes{{8, 6}, {6}};
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  struct Case {
    std::string name;
    int rank;       // the rank whose gradient overflows
    size_t view;    // in which view
    double value;
    bool matrix;    // whether Q went non-finite too (so the next result equals a fresh start)
  };
  const std::vector<Case> cases{{"NaN in a compressed matrix", 1, 0, nan, true},
                                {"inf in a compressed matrix", 0, 0, inf, true},
                                {"-inf in an uncompressed vector", 1, 1, -inf, false}};
  torch::manual_seed(5);
  std::vector<std::vector<Views>> inputs(3);  // [call][rank]
  for (auto& call : inputs) {
    for (int r = 0; r < kWorld; ++r) call.push_back(random_views(shapes));
  }
  for (const Case& c : cases) {
    SECTION(c.name) {
      auto poisoned = inputs[1];
      poisoned[c.rank][c.view] = poisoned[c.rank][c.view].clone();
      poisoned[c.rank][c.view].view(-1)[3].fill_(c.value);
      std::vector<std::vector<Views>> outputs(kWorld);  // [rank][call]
      std::vector<Views> fresh(kWorld);                 // [rank]
      std::vector<Views> kept(kWorld);                  // [rank] call 2 of a run that never overflowed
      run_ranks(kWorld, [&](int rank, const Group& group) {
        PowerSgd psgd(group, compressing());
        Bucket bucket = make_bucket(shapes);
        for (int call = 0; call < 3; ++call) {
          psgd.begin_update();
          outputs[rank].push_back(reduce(psgd, 0, bucket, call == 1 ? poisoned[rank] : inputs[call][rank]));
        }
        PowerSgd other(group, compressing());
        other.begin_update();
        fresh[rank] = reduce(other, 0, bucket, inputs[2][rank]);
        // The same calls without the overflow: its error feedback after call 1 is kept into call 2.
        PowerSgd clean(group, compressing());
        for (int call = 0; call < 3; ++call) {
          clean.begin_update();
          kept[rank] = reduce(clean, 0, bucket, inputs[call][rank]);
        }
      });
      for (int r = 0; r < kWorld; ++r) {
        CAPTURE(r);
        CHECK(all_finite(outputs[r][0]));
        CHECK_FALSE(all_finite(outputs[r][1]));
        CHECK(all_finite(outputs[r][2]));
        // The error of the overflowing update was dropped: the next result is as close to the exact sum
        // as a fresh start's, and equal to it where Q had to be reinitialised.
        const Views exact = sum_over_ranks(inputs[2]);
        CHECK(frobenius({outputs[r][2][0] - exact[0]}) < 2 * frobenius({fresh[r][0] - exact[0]}) + 1e-6);
        CHECK(rel_diff({outputs[r][2][1]}, {exact[1]}) < 1e-6);
        if (c.matrix) CHECK(hetseq::test::all_equal(outputs[r][2], fresh[r]));
        // Where the matrices stayed finite, Q went on as in a run without the overflow, so only the
        // error feedback tells the two apart: carried over, call 2 would be the clean run's.
        if (!c.matrix) CHECK_FALSE(hetseq::test::all_equal(outputs[r][2], kept[r]));
      }
    }
  }
}

TEST_CASE("PowerSGD's options reject a rank below 1 naming --powersgd-rank", "[distributed][powersgd]") {
  for (int64_t rank : {0, -3}) {
    CAPTURE(rank);
    PowerSgdOptions options;
    options.rank = rank;
    CHECK_THAT(hetseq::test::error_of<hetseq::UsageError>([&] { options.validate(); }),
               Catch::StartsWith("--powersgd-rank: " + std::to_string(rank)));
  }
}

TEST_CASE("PowerSGD: a peer that never reaches the allreduce gives an InputError naming rank and bucket",
          "[distributed][powersgd]") {
  OneIntraOpThread one_thread;
  constexpr int kWorld = 2;
  constexpr int kSilent = 0;
  const Shapes shapes{{8, 6}, {6}};
  for (int64_t start_update : {0, 1}) {
    CAPTURE(start_update);
    std::vector<Group> kept(kWorld);  // the silent rank's group stays open: a stalled peer
    auto errors = run_ranks_collect(
        kWorld,
        [&](int rank, const Group& group) {
          kept[rank] = group;
          if (rank == kSilent) return;
          PowerSgdOptions options = compressing();
          options.start_update = start_update;
          PowerSgd psgd(group, options);
          psgd.begin_update();
          Bucket bucket = make_bucket(shapes);
          psgd.reduce(3, bucket.buffer, bucket.grads)->waitAndThrow();
        },
        std::chrono::seconds(2));
    CHECK_FALSE(errors[kSilent]);
    REQUIRE(errors[1]);
    CHECK(is_a<hetseq::InputError>(errors[1]));
    const std::string message = message_of(errors[1]);
    CHECK_THAT(message, Catch::StartsWith("rank 1 of 2: the " +
                                          std::string(start_update == 0
                                                          ? "PowerSGD allreduce of P and the uncompressed gradients of "
                                                          : "allreduce of ") +
                                          "gradient bucket 3 ("));
    CHECK_THAT(message, Catch::Contains("Timed out"));
  }
}

// ---- PowerSGD's state in checkpoints: see Note [PowerSGD in checkpoints] ----

namespace {

// Through a real checkpoint file: `state` written by save_checkpoint and read back by load_checkpoint.
hetseq::PowerSgdState through_file(const hetseq::PowerSgdState& state, const std::string& dir) {
  hetseq::Checkpoint c;
  c.powersgd = state;
  const std::filesystem::path path = std::filesystem::path(dir) / "powersgd.pt";
  hetseq::save_checkpoint(c, {path});
  auto loaded = hetseq::load_checkpoint(path).powersgd;
  if (!loaded) throw std::runtime_error("the checkpoint lost its PowerSGD state");
  return *loaded;
}

// `state` with every rank's error feedback zero: what a resume that dropped it would start from.
hetseq::PowerSgdState without_errors(hetseq::PowerSgdState state) {
  for (auto& b : state.buckets) {
    for (auto& e : b.errors) e = torch::zeros_like(e);
  }
  return state;
}

// Two buckets as a model's: a compressed 16 x 12 matrix with a vector, and a 10 x 8 matrix.
const std::vector<Shapes> kCheckpointBuckets{{{16, 12}, {12}}, {{10, 8}}};

// Random inputs [update][bucket][rank].
std::vector<std::vector<std::vector<Views>>> random_inputs(int updates, int world) {
  std::vector<std::vector<std::vector<Views>>> inputs(updates);
  for (auto& update : inputs) {
    for (const auto& s : kCheckpointBuckets) {
      update.emplace_back();
      for (int r = 0; r < world; ++r) update.back().push_back(random_views(s));
    }
  }
  return inputs;
}

// One update of every bucket (all started before any is waited for); returns [bucket] the results.
std::vector<Views> reduce_update(PowerSgd& psgd, std::vector<Bucket>& buckets,
                                 const std::vector<std::vector<Views>>& update, int rank) {
  psgd.begin_update();
  std::vector<c10::intrusive_ptr<c10::ivalue::Future>> futures;
  for (size_t b = 0; b < buckets.size(); ++b) {
    const Views& values = update[b][rank];
    for (size_t i = 0; i < values.size(); ++i) buckets[b].grads[i].copy_(values[i]);
    futures.push_back(psgd.reduce(static_cast<int64_t>(b), buckets[b].buffer, buckets[b].grads));
  }
  std::vector<Views> out;
  for (size_t b = 0; b < buckets.size(); ++b) {
    futures[b]->waitAndThrow();
    Views views;
    for (const auto& g : buckets[b].grads) views.push_back(g.to(torch::kFloat64));
    out.push_back(views);
  }
  return out;
}

std::vector<Bucket> checkpoint_buckets() {
  std::vector<Bucket> out;
  for (const auto& s : kCheckpointBuckets) out.push_back(make_bucket(s));
  return out;
}

// Largest rel_diff over the buckets of one update's results.
double update_rel_diff(const std::vector<Views>& a, const std::vector<Views>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, rel_diff(a[i], b[i]));
  return worst;
}

}  // namespace

TEST_CASE("PowerSGD state through a checkpoint file: the restored run continues bit for bit, warm-up count included",
          "[distributed][powersgd][checkpoint]") {
  OneIntraOpThread one_thread;
  constexpr int kWorld = 2;
  constexpr int kUpdates = 6;
  constexpr int kSaveAfter = 3;  // updates 0..2 before the save; update 0 is the warm-up
  torch::manual_seed(11);
  const auto inputs = random_inputs(kUpdates, kWorld);
  hetseq::test::TempDir dir;
  PowerSgdOptions options = compressing();
  options.start_update = 1;
  options.seed = 5;
  std::vector<std::vector<std::vector<Views>>> straight(kWorld), resumed(kWorld);  // [rank][update][bucket]
  std::vector<hetseq::PowerSgdState> saved(kWorld);                                // [rank] gather_state's answer
  run_ranks(kWorld, [&](int rank, const Group& group) {
    PowerSgd psgd(group, options);
    auto buckets = checkpoint_buckets();
    for (int u = 0; u < kUpdates; ++u) {
      straight[rank].push_back(reduce_update(psgd, buckets, inputs[u], rank));
      if (u == kSaveAfter - 1) saved[rank] = psgd.gather_state();
    }
  });
  // Rank 0 writes the checkpoint; every rank of the resumed run reads it.
  const hetseq::PowerSgdState file = through_file(saved[0], dir.path());
  run_ranks(kWorld, [&](int rank, const Group& group) {
    PowerSgd psgd(group, options);
    psgd.load_state(file, "ck.pt");
    auto buckets = checkpoint_buckets();
    for (int u = kSaveAfter; u < kUpdates; ++u) resumed[rank].push_back(reduce_update(psgd, buckets, inputs[u], rank));
  });

  REQUIRE(file.update == kSaveAfter - 1);
  REQUIRE(file.world_size == kWorld);
  REQUIRE(file.buckets.size() == 2);
  CHECK(file.buckets[0].matrices == std::vector<int64_t>{0});
  CHECK(file.buckets[0].errors[0].sizes().vec() == std::vector<int64_t>{kWorld, 16, 12});
  CHECK(file.buckets[1].errors[0].sizes().vec() == std::vector<int64_t>{kWorld, 10, 8});
  for (const auto& b : file.buckets) {
    CHECK(b.errors[0][0].abs().max().item<double>() > 0);  // two ranks, two different errors
    CHECK_FALSE(b.errors[0][0].equal(b.errors[0][1]));
  }
  CHECK(saved[1].buckets.size() == 2);
  CHECK(saved[1].buckets[0].errors.empty());  // only rank 0 gets the errors
  CHECK(saved[1].buckets[0].q[0].equal(saved[0].buckets[0].q[0]));  // Q is the same on every rank
  for (int r = 0; r < kWorld; ++r) {
    for (int u = kSaveAfter; u < kUpdates; ++u) {
      for (size_t b = 0; b < kCheckpointBuckets.size(); ++b) {
        CAPTURE(r, u, b);
        CHECK(hetseq::test::all_equal(resumed[r][u - kSaveAfter][b], straight[r][u][b]));
      }
    }
  }
}

TEST_CASE("PowerSGD state restored under another split carries the total error: the next result is the "
          "uninterrupted run's for the same summed gradient",
          "[distributed][powersgd][checkpoint]") {
  OneIntraOpThread one_thread;
  constexpr int kWorld = 2;
  torch::manual_seed(12);
  const auto inputs = random_inputs(3, kWorld);
  // Update 2 cut otherwise: rank 0's part of the sum moves to rank 1 (the sum is the same in float64).
  auto recut = inputs[2];
  for (size_t b = 0; b < recut.size(); ++b) {
    for (size_t i = 0; i < recut[b][0].size(); ++i) {
      const torch::Tensor moved = recut[b][0][i] * 0.75;
      recut[b][1][i] = recut[b][1][i] + moved;
      recut[b][0][i] = recut[b][0][i] - moved;
    }
  }
  std::vector<std::vector<Views>> straight(kWorld);  // [rank][bucket] update 2 of the uninterrupted run
  std::vector<std::vector<Views>> resumed(kWorld), dropped(kWorld);
  hetseq::PowerSgdState saved;
  run_ranks(kWorld, [&](int rank, const Group& group) {
    PowerSgd psgd(group, compressing());
    auto buckets = checkpoint_buckets();
    reduce_update(psgd, buckets, inputs[0], rank);
    reduce_update(psgd, buckets, inputs[1], rank);
    hetseq::PowerSgdState s = psgd.gather_state();
    if (rank == 0) saved = s;
    straight[rank] = reduce_update(psgd, buckets, inputs[2], rank);
  });
  run_ranks(kWorld, [&](int rank, const Group& group) {
    auto buckets = checkpoint_buckets();
    PowerSgd psgd(group, compressing());
    psgd.load_state(saved, "ck.pt");
    resumed[rank] = reduce_update(psgd, buckets, recut, rank);
    PowerSgd without(group, compressing());
    without.load_state(without_errors(saved), "ck.pt");
    dropped[rank] = reduce_update(without, buckets, recut, rank);
  });
  const double diff = update_rel_diff(resumed[0], straight[0]);
  const double diff_dropped = update_rel_diff(dropped[0], straight[0]);
  CAPTURE(diff, diff_dropped);
  CHECK(diff < 1e-5);          // float32 rounding of the other cut only
  CHECK(diff_dropped > 1e-2);  // what the error feedback is worth in this update
  CHECK(hetseq::test::all_equal(resumed[1][0], resumed[0][0]));
}

TEST_CASE("PowerSGD state saved by 3 ranks and restored on 2: rank 0 takes the summed error, the total is kept",
          "[distributed][powersgd][checkpoint]") {
  OneIntraOpThread one_thread;
  torch::manual_seed(13);
  const auto inputs = random_inputs(3, 3);
  // Update 2 on two ranks: rank 0 gets what ranks 0 and 1 had, rank 1 what rank 2 had.
  std::vector<std::vector<Views>> two(kCheckpointBuckets.size());  // [bucket][rank]
  for (size_t b = 0; b < two.size(); ++b) {
    Views first;
    for (size_t i = 0; i < inputs[2][b][0].size(); ++i) first.push_back(inputs[2][b][0][i] + inputs[2][b][1][i]);
    two[b] = {first, inputs[2][b][2]};
  }
  std::vector<std::vector<Views>> straight(3), resumed(2), dropped(2);  // [rank][bucket]
  hetseq::PowerSgdState saved;
  run_ranks(3, [&](int rank, const Group& group) {
    PowerSgd psgd(group, compressing());
    auto buckets = checkpoint_buckets();
    reduce_update(psgd, buckets, inputs[0], rank);
    reduce_update(psgd, buckets, inputs[1], rank);
    hetseq::PowerSgdState s = psgd.gather_state();
    if (rank == 0) saved = s;
    straight[rank] = reduce_update(psgd, buckets, inputs[2], rank);
  });
  REQUIRE(saved.world_size == 3);
  hetseq::log::begin_capture();
  run_ranks(2, [&](int rank, const Group& group) {
    auto buckets = checkpoint_buckets();
    PowerSgd psgd(group, compressing());
    psgd.load_state(saved, "ck.pt");
    resumed[rank] = reduce_update(psgd, buckets, two, rank);
    PowerSgd without(group, compressing());
    without.load_state(without_errors(saved), "ck.pt");
    dropped[rank] = reduce_update(without, buckets, two, rank);
  });
  const auto lines = hetseq::log::end_capture();
  const double diff = update_rel_diff(resumed[0], straight[0]);
  const double diff_dropped = update_rel_diff(dropped[0], straight[0]);
  CAPTURE(diff, diff_dropped);
  CHECK(diff < 1e-5);
  CHECK(diff_dropped > 1e-2);
  CHECK(hetseq::test::all_equal(resumed[1][0], resumed[0][0]));
  CHECK(std::any_of(lines.begin(), lines.end(), [](const std::string& l) {
    return l.find("the errors were saved by 3 ranks and this run has 2: rank 0 takes their sum") != std::string::npos;
  }));
}

TEST_CASE("PowerSGD state that does not fit a bucket is dropped for that bucket, saying why",
          "[distributed][powersgd][checkpoint]") {
  OneIntraOpThread one_thread;
  constexpr int kWorld = 2;
  torch::manual_seed(14);
  const auto inputs = random_inputs(2, kWorld);
  hetseq::PowerSgdState saved;
  run_ranks(kWorld, [&](int rank, const Group& group) {
    PowerSgd psgd(group, compressing());
    auto buckets = checkpoint_buckets();
    reduce_update(psgd, buckets, inputs[0], rank);
    hetseq::PowerSgdState s = psgd.gather_state();
    if (rank == 0) saved = s;
  });
  struct Case {
    std::string name;
    std::function<void(hetseq::PowerSgdState&, PowerSgdOptions&)> change;
    std::string why;
  };
  const std::vector<Case> cases{
      {"other shapes", [](hetseq::PowerSgdState& s, PowerSgdOptions&) { s.buckets[1].shapes = {{8, 10}}; },
       "gradient bucket 1 of ck.pt does not fit this run (its gradients have other shapes than when it was saved)"},
      {"another --powersgd-rank", [](hetseq::PowerSgdState&, PowerSgdOptions& o) { o.rank = 2; },
       "gradient bucket 0 of ck.pt does not fit this run (the Q of view 0 is [12, 1], now [12, 2]; was "
       "--powersgd-rank changed?)"}};
  for (const Case& c : cases) {
    SECTION(c.name) {
      hetseq::PowerSgdState state = saved;
      PowerSgdOptions options = compressing();
      c.change(state, options);
      std::vector<std::vector<Views>> restored(kWorld), fresh(kWorld);  // [rank][bucket]
      hetseq::log::begin_capture();
      run_ranks(kWorld, [&](int rank, const Group& group) {
        auto buckets = checkpoint_buckets();
        PowerSgd psgd(group, options);
        psgd.load_state(state, "ck.pt");
        psgd.begin_update();  // update 1 of the saved run: its second update
        restored[rank].clear();
        PowerSgd other(group, options);
        other.begin_update();
        for (size_t b = 0; b < buckets.size(); ++b) {
          const Views& v = inputs[1][b][rank];
          restored[rank].push_back(reduce(psgd, static_cast<int64_t>(b), buckets[b], v));
          fresh[rank].push_back(reduce(other, static_cast<int64_t>(b), buckets[b], v));
        }
      });
      const auto lines = hetseq::log::end_capture();
      INFO(fmt::format("{}", fmt::join(lines, "\n")));
      CHECK(std::any_of(lines.begin(), lines.end(),
                        [&](const std::string& l) { return l.find(c.why) != std::string::npos; }));
      const size_t dropped_bucket = c.name == "other shapes" ? 1 : 0;
      for (int r = 0; r < kWorld; ++r) CHECK(hetseq::test::all_equal(restored[r][dropped_bucket], fresh[r][dropped_bucket]));
      if (c.name == "other shapes") CHECK_FALSE(hetseq::test::all_equal(restored[0][0], fresh[0][0]));  // bucket 0 was restored
    }
  }
}
