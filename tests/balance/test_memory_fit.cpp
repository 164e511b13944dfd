// The memory check's arithmetic and its one line (Note [Memory that a rank needs]), and the peak of
// the bytes that a piece of work allocates.
#include <catch2/catch.hpp>

#include <torch/torch.h>

#include "hetseq/balance/allocation_peak.h"
#include "hetseq/shard/memory_fit.h"
#include "hetseq/shard/shard_reducer.h"
#include "hetseq/core/error.h"

using hetseq::MemoryFitOptions;
using hetseq::RankMemoryBudget;
using hetseq::ZeroSharding;

namespace {

// 1000 float32 parameters, Adam (2 buffers), 3 ranks with budgets 1:1:2 (in units of 2e4 bytes) and
// activations 100, 200, 300 bytes.
MemoryFitOptions three_ranks(ZeroSharding sharding) {
  MemoryFitOptions o;
  o.sharding = sharding;
  o.num_params = 1000;
  o.element_bytes = 4;
  o.state_buffers = 2;
  o.optimizer = "adam";
  o.alignment = 16;
  o.ranks = {RankMemoryBudget{20000, false, 100, 7}, RankMemoryBudget{20000, false, 200, 13},
             RankMemoryBudget{40000, false, 300, 29}};
  return o;
}

}  // namespace

TEST_CASE("memory_needs: whole parameters and gradients, the shard's optimizer state, the gather buffers, the "
          "activations",
          "[zero_shard][memory]") {
  const auto os = hetseq::memory_needs(three_ranks(ZeroSharding::kOptimizerState));
  REQUIRE(os.size() == 3);
  // plan_shards(1:1:2, 1000, 16): boundaries at round(63 * 1/4) * 16 = 256 and round(63 * 1/2) * 16 = 512.
  const std::vector<int64_t> shard{256, 256, 488};
  const std::vector<int64_t> activations{100, 200, 300};
  for (size_t r = 0; r < 3; ++r) {
    CHECK(os[r].parameters == 4000);
    CHECK(os[r].gradients == 4000);
    CHECK(os[r].optimizer_state == shard[r] * 2 * 4);
    CHECK(os[r].gather_buffers == 488 * 4);  // per-rank broadcasts through one buffer of the largest shard
    CHECK(os[r].activations == activations[r]);
  }
  CHECK(os[0].total() == 4000 + 4000 + 2048 + 1952 + 100);

  auto padded = three_ranks(ZeroSharding::kOptimizerState);
  padded.gather = hetseq::GatherMethod::kAllgatherPadded;
  CHECK(hetseq::memory_needs(padded)[1].gather_buffers == 4 * 488 * 4);  // 3 receive buffers and the send buffer

  // os+grad: the gradients of the shard, and 2 W + 1 = 7 buckets in flight, capped at the model's gradients.
  // The buckets are at most 1/(8 W) of the gradients and at least 64 KiB (shard_bucket_bytes).
  CHECK(hetseq::shard_bucket_bytes(24 << 20, 3, 25 << 20) == 1 << 20);
  CHECK(hetseq::shard_bucket_bytes(24 << 20, 3, 100 << 10) == 100 << 10);
  CHECK(hetseq::shard_bucket_bytes(4000, 3, 25 << 20) == 64 << 10);
  auto grad = three_ranks(ZeroSharding::kGradients);
  grad.num_params = 6 << 20;  // 24 MiB of float32 gradients: 1 MiB buckets
  const auto os_grad = hetseq::memory_needs(grad);
  const auto os_big = hetseq::memory_needs([&] {
    auto o = grad;
    o.sharding = ZeroSharding::kOptimizerState;
    return o;
  }());
  for (size_t r = 0; r < 3; ++r) {
    CHECK(os_grad[r].parameters == 24 << 20);
    CHECK(os_grad[r].optimizer_state == os_big[r].optimizer_state);
    CHECK(os_grad[r].gradients == os_big[r].optimizer_state / 2 + 7 * (1 << 20));
  }
  CHECK(hetseq::memory_needs(three_ranks(ZeroSharding::kGradients))[0].gradients == 4000);  // capped

  // full: os+grad's gradients and state, and as parameters the shard, the root and two units (Note [Sharded
  // parameters]); no gather buffer; rank 0's copy of the whole model for a checkpoint where it saves on a CPU.
  auto full = grad;
  full.sharding = ZeroSharding::kFull;
  full.root_numel = 1 << 20;
  full.largest_unit_numel = 256 << 10;
  const auto sharded = hetseq::memory_needs(full);
  for (size_t r = 0; r < 3; ++r) {
    const int64_t shard = os_big[r].optimizer_state / 8;  // Adam's 2 buffers of 4 bytes per element
    CHECK(sharded[r].parameters == 4 * (shard + (1 << 20) + 2 * (256 << 10)));
    CHECK(sharded[r].gradients == os_grad[r].gradients);
    CHECK(sharded[r].optimizer_state == os_grad[r].optimizer_state);
    CHECK(sharded[r].gather_buffers == 0);
    CHECK(sharded[r].checkpoint_copy == 0);
  }
  // A rank that runs 2 micro-batches an update holds the first one's gradients whole.
  auto accumulating = full;
  accumulating.ranks[1].accumulates = true;
  CHECK(hetseq::memory_needs(accumulating)[1].gradients == 24 << 20);
  CHECK(hetseq::memory_needs(accumulating)[0].gradients == os_grad[0].gradients);
  full.rank0_copies_model = true;
  CHECK(hetseq::memory_needs(full)[0].checkpoint_copy == 24 << 20);
  CHECK(hetseq::memory_needs(full)[1].checkpoint_copy == 0);

  const auto none = hetseq::memory_needs(three_ranks(ZeroSharding::kNone));
  for (size_t r = 0; r < 3; ++r) {
    CHECK(none[r].optimizer_state == 8000);
    CHECK(none[r].gather_buffers == 0);
    CHECK(none[r].total() == 16000 + activations[r]);
  }
  // A budget read as the free memory after the model was built has the parameters in it already.
  auto free = three_ranks(ZeroSharding::kNone);
  free.ranks[1].from_free_memory = true;
  CHECK(hetseq::memory_needs(free)[1].parameters == 0);
  CHECK(hetseq::memory_needs(free)[0].parameters == 4000);
}

TEST_CASE("check_memory_fits: one line naming the first rank that does not fit, its need and its budget",
          "[zero_shard][memory]") {
  auto o = three_ranks(ZeroSharding::kOptimizerState);
  CHECK_NOTHROW(hetseq::check_memory_fits(o));  // needs 12100, 12200, 14156 bytes

  // 5000:20000:40000: rank 0's shard ends at round(63 * 5000 / 65000) * 16 = 80 elements, rank 2's
  // has 616, so rank 0 needs 8000 + 640 + 2464 + 100 = 11204.
  o.ranks[0].budget_bytes = 5000;
  CHECK_THROWS_MATCHES(hetseq::check_memory_fits(o), hetseq::InputError,
                       Catch::Message("--memory-budget: rank 0 needs 11204 bytes but has 5000 bytes available (its "
                                      "--memory-budget of 4.65661e-06 GB): parameters 4000, gradients 4000, adam "
                                      "optimizer state 640 (2 buffer(s) per element, its shard), shard gather "
                                      "buffers 2464, activations 100 (one forward and backward of 7 samples); give "
                                      "it a larger --memory-budget (its shard of the optimizer state grows with it, "
                                      "the rest does not) or a smaller --max-sentences"));

  // full, rank 0 saving on a CPU with budgets 10000:20000:40000: its shard of round(63 / 7) * 16 = 144 elements, a
  // root of 100 and two units of 200 (2576 bytes), the gradients (capped at the model's 4000), the state 1152,
  // activations 100, and the whole model's copy 4000 for the checkpoint: 11828; 7828 without the copy.
  auto full = three_ranks(ZeroSharding::kFull);
  full.root_numel = 100;
  full.largest_unit_numel = 200;
  full.ranks[0].budget_bytes = 10000;
  CHECK_NOTHROW(hetseq::check_memory_fits(full));
  full.rank0_copies_model = true;
  CHECK_THROWS_WITH(hetseq::check_memory_fits(full),
                    Catch::StartsWith("--memory-budget: rank 0 needs 11828 bytes but has 10000 bytes available") &&
                        Catch::Contains("parameters 2576, gradients 4000, adam optimizer state 1152") &&
                        Catch::Contains(", the whole model gathered for a checkpoint 4000 (--no-save avoids it); "
                                        "give it a larger --memory-budget (its shard of the parameters, gradients "
                                        "and optimizer state grows with it"));

  // Without sharding every rank holds the whole state; a rank without a budget (0) is not checked.
  auto none = three_ranks(ZeroSharding::kNone);
  none.ranks[0].budget_bytes = 0;
  none.ranks[1].budget_bytes = 16199;  // needs 16200
  none.ranks[2].budget_bytes = 16299;  // needs 16300
  CHECK_THROWS_WITH(hetseq::check_memory_fits(none),
                    Catch::StartsWith("--memory-budget: rank 1 needs 16200 bytes but has 16199 bytes available (its "
                                      "--memory-budget of ") &&
                        Catch::Contains("(1 other rank(s) do not fit either): parameters 4000, gradients 4000, adam "
                                        "optimizer state 8000 (2 buffer(s) per element), activations 200") &&
                        Catch::EndsWith("or shard the optimizer state with --zero-sharding os"));
  none.ranks[1].budget_bytes = 16200;
  none.ranks[2].budget_bytes = 16300;
  CHECK_NOTHROW(hetseq::check_memory_fits(none));
}

TEST_CASE("peak_allocated_bytes counts what the work holds at once, from zero at its start", "[zero_shard][memory]") {
  const torch::Tensor before = torch::ones({1 << 20});  // allocated before: not counted, even when freed inside
  const int64_t peak = hetseq::peak_allocated_bytes([] {
    const torch::Tensor a = torch::empty({1000}, torch::kFloat32);  // 4000 bytes
    {
      const torch::Tensor b = torch::empty({2000}, torch::kFloat32);  // 8000 bytes, freed
    }
    const torch::Tensor c = torch::empty({500}, torch::kFloat64);  // 4000 bytes
  });
  CHECK(peak == 12000);
  // A forward and backward holds at least the saved input of the product and the gradient.
  const torch::Tensor w = torch::randn({256, 256}, torch::requires_grad());
  const int64_t step = hetseq::peak_allocated_bytes([&] {
    const torch::Tensor x = torch::randn({64, 256});
    torch::matmul(x, w).relu().sum().backward();
  });
  CHECK(step >= 64 * 256 * 4 + 256 * 256 * 4);
  CHECK(step < 64 * 256 * 4 * 10 + 256 * 256 * 4 * 3);
}
