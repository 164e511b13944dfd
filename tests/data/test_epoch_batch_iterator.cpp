#include <algorithm>
#include <set>

#include <catch2/catch.hpp>

#include "hetseq/core/error.h"
#include "hetseq/data/batch_loader.h"
#include "hetseq/data/epoch_batch_iterator.h"

using namespace hetseq;

namespace {

std::vector<std::vector<int64_t>> whole_epoch(EpochBatchIterator& it, int64_t epoch) {
  std::vector<std::vector<int64_t>> out;
  it.begin_epoch(epoch);
  while (!it.end_of_epoch()) {
    for (auto& mb : it.next_update()) out.push_back(mb);
  }
  return out;
}

std::vector<int64_t> flatten(const std::vector<std::vector<int64_t>>& batches) {
  std::vector<int64_t> all;
  for (const auto& b : batches) all.insert(all.end(), b.begin(), b.end());
  return all;
}

DataPlan plan_of(std::vector<int64_t> b, std::vector<int64_t> u, int64_t rank) {
  DataPlan p;
  p.batch_sizes = std::move(b);
  p.update_freqs = std::move(u);
  p.rank = rank;
  return p;
}

// A dataset whose batches carry their sample indices, to follow them through the loader threads.
class IndexDataset : public Dataset {
 public:
  explicit IndexDataset(int64_t n) : n_(n) {}
  int64_t size() const override { return n_; }
  Batch collate(const std::vector<int64_t>& indices) const override {
    Batch b;
    b.fields["index"] = torch::tensor(indices, torch::kInt64);
    b.num_samples = static_cast<int64_t>(indices.size());
    return b;
  }

 private:
  int64_t n_;
};

}  // namespace

TEST_CASE("same seed gives the same order and another seed or epoch another", "[iterator]") {
  EpochIteratorOptions o;
  o.seed = 7;
  EpochBatchIterator a(1000, DataPlan::single(32, 1), o), b(1000, DataPlan::single(32, 1), o);
  CHECK(whole_epoch(a, 1) == whole_epoch(b, 1));
  CHECK(whole_epoch(a, 2) != whole_epoch(b, 1));
  o.seed = 8;
  EpochBatchIterator c(1000, DataPlan::single(32, 1), o);
  CHECK(whole_epoch(c, 1) != whole_epoch(b, 1));
}

TEST_CASE("every sample exactly once per epoch, with the last batch short", "[iterator]") {
  EpochIteratorOptions o;
  EpochBatchIterator it(1001, DataPlan::single(64, 3), o);
  CHECK(it.updates_per_epoch() == 6);  // ceil(1001 / 192)
  const auto batches = whole_epoch(it, 3);
  CHECK(batches.size() == 6 * 3);
  for (size_t i = 0; i + 1 < batches.size(); ++i) {
    if (i < 15) CHECK(batches[i].size() == 64);
  }
  auto all = flatten(batches);
  CHECK(all.size() == 1001);
  std::sort(all.begin(), all.end());
  for (int64_t i = 0; i < 1001; ++i) REQUIRE(all[i] == i);
}

TEST_CASE("curriculum keeps the dataset order for its first epochs", "[iterator]") {
  EpochIteratorOptions o;
  o.curriculum = 1;
  EpochBatchIterator it(100, DataPlan::single(10, 1), o);
  auto first = flatten(whole_epoch(it, 1));
  for (int64_t i = 0; i < 100; ++i) REQUIRE(first[i] == i);
  auto second = flatten(whole_epoch(it, 2));
  CHECK(!std::is_sorted(second.begin(), second.end()));
}

TEST_CASE("a restored position continues exactly", "[iterator]") {
  EpochIteratorOptions o;
  o.seed = 3;
  EpochBatchIterator full(777, DataPlan::single(16, 2), o);
  const auto expected = whole_epoch(full, 2);

  EpochBatchIterator first(777, DataPlan::single(16, 2), o);
  first.begin_epoch(2);
  std::vector<std::vector<int64_t>> got;
  for (int k = 0; k < 5; ++k) {
    for (auto& mb : first.next_update()) got.push_back(mb);
  }
  const IteratorPosition saved = first.position();
  CHECK(saved.epoch == 2);
  CHECK(saved.offset == 5 * 32);

  EpochBatchIterator resumed(777, DataPlan::single(16, 2), o);
  resumed.restore(saved);
  resumed.begin_epoch(2);
  while (!resumed.end_of_epoch()) {
    for (auto& mb : resumed.next_update()) got.push_back(mb);
  }
  CHECK(got == expected);

  CHECK_THROWS_AS(resumed.restore(IteratorPosition{2, 778}), InputError);
}

TEST_CASE("unequal ranks: same number of updates, every sample exactly once", "[iterator]") {
  const std::vector<int64_t> b{7, 13, 29}, u{1, 3, 2};
  EpochIteratorOptions o;
  std::vector<int64_t> all;
  int64_t updates = -1;
  for (int64_t r = 0; r < 3; ++r) {
    EpochBatchIterator it(1000, plan_of(b, u, r), o);
    it.begin_epoch(1);
    int64_t n = 0;
    while (!it.end_of_epoch()) {
      const auto mbs = it.next_update();
      REQUIRE(static_cast<int64_t>(mbs.size()) == u[r]);
      for (const auto& mb : mbs) {
        REQUIRE(static_cast<int64_t>(mb.size()) <= b[r]);
        all.insert(all.end(), mb.begin(), mb.end());
      }
      ++n;
    }
    if (updates < 0) updates = n;
    CHECK(n == updates);  // 1000 / (7 + 39 + 58) -> 10 updates on every rank
  }
  CHECK(updates == 10);
  std::sort(all.begin(), all.end());
  REQUIRE(all.size() == 1000);
  for (int64_t i = 0; i < 1000; ++i) REQUIRE(all[i] == i);
}

TEST_CASE("bad plans are usage errors naming the flag", "[iterator]") {
  CHECK_THROWS_WITH(DataPlan::single(0, 1), Catch::Contains("--max-sentences"));
  CHECK_THROWS_WITH(DataPlan::single(8, 0), Catch::Contains("--update-freq"));
  CHECK_THROWS_AS(EpochBatchIterator(0, DataPlan::single(8, 1), {}), InputError);
}

TEST_CASE("background loading never changes the order of batches", "[iterator][loader]") {
  auto dataset = std::make_shared<IndexDataset>(503);
  EpochIteratorOptions o;
  o.seed = 11;
  for (int64_t workers : {0, 1, 3}) {
    INFO("workers " << workers);
    UpdateStream stream(EpochBatchIterator(503, DataPlan::single(10, 2), o),
                        std::make_shared<BatchLoader>(dataset, workers));
    EpochBatchIterator reference(503, DataPlan::single(10, 2), o);
    for (int64_t epoch : {1, 2}) {
      stream.begin_epoch(epoch);
      reference.begin_epoch(epoch);
      while (!reference.end_of_epoch()) {
        REQUIRE(!stream.end_of_epoch());
        const auto expected = reference.next_update();
        const auto batches = stream.next();
        REQUIRE(batches.size() == expected.size());
        for (size_t k = 0; k < batches.size(); ++k) {
          const auto idx = batches[k].at("index");
          std::vector<int64_t> got(idx.data_ptr<int64_t>(), idx.data_ptr<int64_t>() + idx.numel());
          REQUIRE(got == expected[k]);
        }
        CHECK(stream.position() == reference.position());
      }
      CHECK(stream.end_of_epoch());
    }
  }
}
