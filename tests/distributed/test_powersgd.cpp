// PowerSGD gradient compression with ranks as threads in one process, each with its own Gloo process
// group (level 1 of STYLE's test levels; see support/rank_threads.h). See Note [PowerSGD].
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "hetseq/core/error.h"
#include "hetseq/distributed/powersgd.h"
#include "support/rank_threads.h"

using hetseq::PowerSgd;
using hetseq::PowerSgdOptions;

namespace {

using hetseq::test::Group;
using hetseq::test::is_a;
using hetseq::test::message_of;
using hetseq::test::OneIntraOpThread;
using hetseq::test::run_ranks;
using hetseq::test::run_ranks_collect;

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

bool all_equal(const Views& a, const Views& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!a[i].equal(b[i])) return false;
  }
  return true;
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
    PowerSgdOptions options;
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
      for (int r = 1; r < kWorld; ++r) CHECK(all_equal(outputs[r][u][b], outputs[0][u][b]));
    }
  }
}

TEST_CASE("PowerSGD at rank 1 is one power iteration of the sum from the initial Q", "[distributed][powersgd]") {
  OneIntraOpThread one_thread;
  constexpr int kWorld = 3;
  constexpr int64_t kBucket = 2;
  const Shapes shapes{{5}, {8, 5}};  // (8 + 5) * 1 * 2 <= 40: the matrix is compressed
  PowerSgdOptions options;
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
  for (int r = 1; r < kWorld; ++r) CHECK(all_equal(outputs[r], outputs[0]));
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
    PowerSgd psgd(group, PowerSgdOptions{});
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
  for (int c = 0; c < kCalls; ++c) CHECK(all_equal(outputs[1][c], outputs[0][c]));
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
    PowerSgdOptions options;
    options.start_update = 2;
    PowerSgd psgd(group, options);
    Bucket bucket = make_bucket(shapes);
    for (int u = 0; u < 3; ++u) {
      psgd.begin_update();
      outputs[rank].push_back(reduce(psgd, 0, bucket, inputs[rank]));
    }
    PowerSgd other(group, PowerSgdOptions{});
    other.begin_update();
    fresh[rank] = reduce(other, 0, bucket, inputs[rank]);
  });
  const Views exact = sum_over_ranks(inputs);
  for (int r = 0; r < kWorld; ++r) {
    CAPTURE(r);
    CHECK(all_equal(outputs[r][0], exact));
    CHECK(all_equal(outputs[r][1], exact));
    CHECK_FALSE(all_equal(outputs[r][2], exact));  // update 2 is compressed ...
    CHECK(all_equal(outputs[r][2], fresh[r]));     // ... as if the warm-up had not been
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
        PowerSgd psgd(group, PowerSgdOptions{});
        Bucket bucket = make_bucket(shapes);
        for (int call = 0; call < 3; ++call) {
          psgd.begin_update();
          outputs[rank].push_back(reduce(psgd, 0, bucket, call == 1 ? poisoned[rank] : inputs[call][rank]));
        }
        PowerSgd other(group, PowerSgdOptions{});
        other.begin_update();
        fresh[rank] = reduce(other, 0, bucket, inputs[2][rank]);
        // The same calls without the overflow: its error feedback after call 1 is kept into call 2.
        PowerSgd clean(group, PowerSgdOptions{});
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
        if (c.matrix) CHECK(all_equal(outputs[r][2], fresh[r]));
        // Where the matrices stayed finite, Q went on as in a run without the overflow, so only the
        // error feedback tells the two apart: carried over, call 2 would be the clean run's.
        if (!c.matrix) CHECK_FALSE(all_equal(outputs[r][2], kept[r]));
      }
    }
  }
}

TEST_CASE("PowerSGD rejects a rank below 1 naming --powersgd-rank", "[distributed][powersgd]") {
  for (int64_t rank : {0, -3}) {
    CAPTURE(rank);
    std::string message;
    run_ranks(1, [&](int, const Group& group) {
      PowerSgdOptions options;
      options.rank = rank;
      try {
        PowerSgd psgd(group, options);
      } catch (const hetseq::UsageError& e) {
        message = e.what();
      }
    });
    CHECK_THAT(message, Catch::StartsWith("--powersgd-rank: " + std::to_string(rank)));
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
          PowerSgdOptions options;
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
