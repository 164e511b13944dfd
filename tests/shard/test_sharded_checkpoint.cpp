// Sharded checkpoints (--zero-sharding os): each rank's optimizer shard in its own file beside the
// checkpoint, a manifest listing them, the re-cut on resume, the refusals of an incomplete or foreign set,
// SIGKILL during a sharded save, and retention. Level 1: the shard files and the re-cut alone; level 2:
// 3 hetseq-train processes over Gloo loopback. See Note [Sharded optimizer state in checkpoints].
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "hetseq/checkpoint/checkpoint_file.h"
#include "hetseq/shard/optimizer_shards.h"
#include "hetseq/core/error.h"
#include "hetseq/core/format.h"
#include "support/hooked_train.h"
#include "support/mnist_files.h"
#include "support/process_checks.h"
#include "support/run_output.h"
#include "support/save_pause.h"
#include "support/subprocess.h"
#include "support/test_paths.h"
#include "tasks/mnist/mnist_model.h"

namespace fs = std::filesystem;
using namespace hetseq::test;
using namespace std::chrono_literals;
using Catch::Contains;

namespace {

// The first 1500 training images of the shipped Fashion-MNIST (no validation), written once per test process.
const std::string& sharded_checkpoint_data() { return fashion_mnist_prefix(1500, 100); }

// Rank r's command line of a run on `batches.size()` ranks (batch sizes `batches`, 49 samples per update in
// all), Adam with weight decay and --clip-norm, checkpoints with the optimizer state in `dir`/ck, up to
// update `updates`; under os with the given budgets in GB.
std::vector<std::vector<std::string>> commands(const std::string& dir, const std::string& sharding,
                                               const std::vector<int>& batches,
                                               const std::vector<std::string>& budgets, int updates,
                                               const std::vector<std::string>& more = {}) {
  std::vector<std::vector<std::string>> out;
  static int run = 0;
  const std::string rendezvous = dir + "/rendezvous" + std::to_string(run++);
  for (size_t r = 0; r < batches.size(); ++r) {
    auto args = with(mnist_train_args(sharded_checkpoint_data(), dir + "/ck"),
                     {"--dropout", "0,0", "--weight-decay", "0.01", "--clip-norm", "0.5", "--max-update",
                      std::to_string(updates), "--disable-validation", "--max-sentences", std::to_string(batches[r]),
                      "--zero-sharding", sharding});
    if (batches.size() > 1) {
      args = with(args, {"--distributed-world-size", std::to_string(batches.size()), "--distributed-rank",
                         std::to_string(r), "--distributed-init-method", "file://" + rendezvous});
    }
    if (sharding == "os") args = with(args, {"--memory-budget", budgets[r]});
    out.push_back(with(args, more));
  }
  return out;
}

const std::vector<int> kThree{7, 13, 29};
const std::vector<std::string> kBudgets112{"1", "1", "2"};

std::vector<ProcessResult> train(const std::string& dir, const std::string& sharding, const std::vector<int>& batches,
                                 const std::vector<std::string>& budgets, int updates,
                                 const std::vector<std::string>& more = {}) {
  return run_processes(commands(dir, sharding, batches, budgets, updates, more), 300s);
}

// Every file of a directory with its bytes: what "nothing overwritten" compares.
std::map<std::string, std::string> contents(const fs::path& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    std::ifstream in(e.path(), std::ios::binary);
    out[e.path().filename().string()] = std::string(std::istreambuf_iterator<char>(in), {});
  }
  return out;
}

// The shard set that `checkpoint` names, opened and checked (what a resume does first).
std::shared_ptr<const hetseq::OptimizerShards> open_shards(const fs::path& checkpoint) {
  const auto c = hetseq::load_checkpoint(checkpoint);
  REQUIRE(c.optimizer_shards.has_value());
  return hetseq::OptimizerShards::open(checkpoint, *c.optimizer_shards, c.num_updates);
}

}  // namespace

TEST_CASE("Shard files and manifests whose checkpoint is gone are removed at start, and no other file",
          "[checkpoint][zero_shard]") {
  TempDir dir;
  const std::string id = "0123456789abcdef", other = "fedcba9876543210";
  const std::vector<std::string> kept{"checkpoint_last.pt", "checkpoint_last." + id + ".shard-0-of-2.pt",
                                      "checkpoint_last." + id + ".manifest.json",
                                      "checkpoint_last." + other + ".shard-1-of-2.pt",  // a rewritten name's: a save removes it
                                      "checkpoint_1_4.pt.tmp", "notes.txt", "checkpoint_2_8.0123.shard-0-of-2.pt"};
  const std::vector<std::string> orphans{"checkpoint_1_4." + id + ".shard-0-of-2.pt",
                                         "checkpoint_1_4." + id + ".shard-1-of-2.pt",
                                         "checkpoint_1_4." + id + ".manifest.json",
                                         "checkpoint_best." + other + ".manifest.json"};
  for (const auto& name : kept) std::ofstream(dir / name) << "x";
  for (const auto& name : orphans) std::ofstream(dir / name) << "x";
  std::set<std::string> removed;
  for (const auto& p : hetseq::remove_orphan_shard_sets(dir.path())) removed.insert(p.filename().string());
  CHECK(removed == std::set<std::string>(orphans.begin(), orphans.end()));
  for (const auto& name : kept) CHECK(fs::exists(dir / name));
  for (const auto& name : orphans) CHECK(!fs::exists(dir / name));
}

TEST_CASE("Optimizer shard files re-cut onto any range: a range spanning several files, straddled parameters",
          "[checkpoint][zero_shard]") {
  TempDir dir;
  const fs::path main = dir / "checkpoint_last.pt";
  const std::vector<int64_t> numels{10, 7, 30, 5};  // [param]; 52 elements
  const int64_t total = 52;
  // The unsharded state: two buffers per parameter, distinct values; parameter 3 never stepped.
  const torch::Tensor avg = torch::arange(total, torch::kFloat32) * 0.5, sq = torch::arange(total, torch::kFloat32) + 100;
  const std::vector<std::pair<int64_t, int64_t>> old_plan{{0, 16}, {16, 16}, {32, 20}};  // [rank] first, numel
  hetseq::ShardManifest manifest{"00000000000000aa", "checkpoint_last.pt", 9, 3, total, {}};
  std::vector<int64_t> starts{0, 10, 17, 47};
  for (int64_t r = 0; r < 3; ++r) {
    hetseq::optim::StatePiece piece{old_plan[r].first, old_plan[r].second, {}};
    const int64_t a = old_plan[r].first, b = a + old_plan[r].second;
    for (size_t i = 0; i < numels.size(); ++i) {
      const int64_t lo = std::max(a, starts[i]), hi = std::min(b, starts[i] + numels[i]);
      if (lo >= hi || i == 3) continue;
      piece.state[fmt::format("param.{}.step", i)] = torch::scalar_tensor(int64_t{9}, torch::kInt64);
      piece.state[fmt::format("param.{}.exp_avg", i)] = avg.narrow(0, lo, hi - lo);
      piece.state[fmt::format("param.{}.exp_avg_sq", i)] = sq.narrow(0, lo, hi - lo);
    }
    manifest.shards.push_back(hetseq::write_optimizer_shard(piece, manifest.save_id, r, 3,
                                                            hetseq::shard_file_path(main, manifest.save_id, r, 3)));
  }
  CHECK(manifest.shards[1].file == "checkpoint_last.00000000000000aa.shard-1-of-3.pt");
  hetseq::write_manifest(manifest, hetseq::manifest_path(main, manifest.save_id));
  const auto shards = hetseq::OptimizerShards::open(main, {manifest.save_id, 3}, 9);
  // New ranges: the whole space, one inside a file, one spanning all three files, and 2 ranks 1:3.
  for (const auto& [first, numel] : std::vector<std::pair<int64_t, int64_t>>{{0, 52}, {3, 5}, {12, 30}, {0, 13}, {13, 39}}) {
    CAPTURE(first, numel);
    const auto piece = shards->read_range(first, numel, numels);
    std::set<std::string> keys;
    for (size_t i = 0; i < 3; ++i) {
      const int64_t lo = std::max(first, starts[i]), hi = std::min(first + numel, starts[i] + numels[i]);
      if (lo >= hi) continue;
      CHECK(torch::equal(piece.state.at(fmt::format("param.{}.exp_avg", i)), avg.narrow(0, lo, hi - lo)));
      CHECK(torch::equal(piece.state.at(fmt::format("param.{}.exp_avg_sq", i)), sq.narrow(0, lo, hi - lo)));
      CHECK(piece.state.at(fmt::format("param.{}.step", i)).item<int64_t>() == 9);
      keys.insert({fmt::format("param.{}.exp_avg", i), fmt::format("param.{}.exp_avg_sq", i),
                   fmt::format("param.{}.step", i)});
    }
    std::set<std::string> got;
    for (const auto& [k, t] : piece.state) got.insert(k);
    CHECK(got == keys);  // nothing for parameter 3, which never stepped
  }
  // Another model's size is refused, naming the manifest.
  CHECK_THROWS_WITH(shards->read_range(0, 53, {10, 7, 30, 6}),
                    Contains(hetseq::manifest_path(main, manifest.save_id).string()) && Contains("52 elements"));
}

TEST_CASE("A sharded checkpoint keeps each rank's shard in its own file and resumes on 2 ranks 1:3 and on 1 rank "
          "none as the ordinary checkpoint does, bit for bit",
          "[distributed][multiprocess][zero_shard][checkpoint]") {
  TempDir sharded, ordinary, straight;
  require_all(train(sharded.path(), "os", kThree, kBudgets112, 10), "os 1:1:2 to 10");
  require_all(train(ordinary.path(), "none", kThree, {}, 10), "none to 10");

  // The checkpoint: the whole model, the optimizer's scalars, and a reference to the shard set.
  const fs::path last = sharded / "ck/checkpoint_last.pt";
  const auto saved = hetseq::load_checkpoint(last);
  REQUIRE(saved.optimizer_shards.has_value());
  CHECK(saved.optimizer_shards->world_size == 3);
  CHECK(saved.optimizer_shards->save_id.size() == 16);
  REQUIRE(saved.optimizer_state.has_value());
  for (const auto& [k, t] : *saved.optimizer_state) CHECK(k.rfind("param.", 0) != 0);
  const auto manifest = hetseq::read_manifest(hetseq::manifest_path(last, saved.optimizer_shards->save_id));
  CHECK(manifest.checkpoint == "checkpoint_last.pt");
  CHECK(manifest.num_updates == 10);
  REQUIRE(manifest.shards.size() == 3);
  int64_t total = 0;
  for (const auto& p : mnist_params_of(last)) total += p.numel();
  CHECK(manifest.total_numel == total);
  const std::vector<double> share{0.25, 0.25, 0.5};
  for (size_t r = 0; r < 3; ++r) {
    const auto& e = manifest.shards[r];
    CHECK(e.file == fmt::format("checkpoint_last.{}.shard-{}-of-3.pt", saved.optimizer_shards->save_id, r));
    CHECK(static_cast<int64_t>(fs::file_size(fs::path(sharded / "ck") / e.file)) == e.bytes);
    CHECK(std::abs(static_cast<double>(e.numel) - share[r] * static_cast<double>(total)) <= 16);
    // Adam's two float32 moments of the shard, and little else: no rank's file holds the whole state.
    CHECK(e.bytes > 2 * 4 * e.numel);
    CHECK(e.bytes < 2 * 4 * e.numel + 64 * 1024);
  }
  // Read whole, the shards are the ordinary checkpoint's state (os trains what none trains, bit for bit).
  const auto expected = hetseq::load_checkpoint(ordinary / "ck/checkpoint_last.pt");
  std::vector<int64_t> numels;
  for (const auto& p : mnist_params_of(last)) numels.push_back(p.numel());
  const auto whole = open_shards(last)->read_range(0, total, numels);
  size_t buffers = 0;
  for (const auto& [k, t] : *expected.optimizer_state) {
    if (k.rfind("param.", 0) != 0) continue;
    INFO(k);
    REQUIRE(whole.state.count(k) == 1);
    CHECK(torch::equal(whole.state.at(k).reshape(t.sizes()), t));
    ++buffers;
  }
  CHECK(buffers == whole.state.size());
  // And re-cut at boundaries inside the old shards (1:1:2 cuts at T/4 and T/2, as 1:3 does at T/4).
  for (const auto& [first, end] : std::vector<std::pair<int64_t, int64_t>>{{total / 3, 2 * total / 3}, {5, total - 5}}) {
    const auto piece = open_shards(last)->read_range(first, end - first, numels);
    CHECK(!piece.state.empty());
    for (const auto& [k, t] : piece.state) {
      if (k.size() > 5 && k.compare(k.size() - 5, 5, ".step") == 0) continue;
      const auto dot = k.find('.', 6);
      const auto i = static_cast<int64_t>(std::stoll(k.substr(6, dot - 6)));
      int64_t start = 0;
      for (int64_t j = 0; j < i; ++j) start += numels[static_cast<size_t>(j)];
      const int64_t lo = std::max(first, start), hi = std::min(end, start + numels[static_cast<size_t>(i)]);
      INFO(k << " in [" << first << ", " << end << ")");
      CHECK(torch::equal(t, expected.optimizer_state->at(k).reshape({-1}).narrow(0, lo - start, hi - lo)));
    }
  }

  // Resumed from either checkpoint on 2 ranks (os, 1:3) and on 1 rank (none), to update 20: the same
  // parameters, bit for bit; and the run that never stopped, within 1e-6 relative in norm (other ranks
  // sum the gradients in another order, whatever the checkpoint).
  TempDir s2, o2, s1, o1;
  for (const auto& [from, to] : std::vector<std::pair<const TempDir*, const TempDir*>>{
           {&sharded, &s2}, {&ordinary, &o2}, {&sharded, &s1}, {&ordinary, &o1}}) {
    fs::copy(from->path() + "/ck", to->path() + "/ck", fs::copy_options::recursive);
  }
  const auto s2r = train(s2.path(), "os", {20, 29}, {"1", "3"}, 20);
  require_all(s2r, "sharded to 2 ranks 1:3");
  CHECK_THAT(s2r[0].err, Contains("resumed from"));
  require_all(train(o2.path(), "os", {20, 29}, {"1", "3"}, 20), "ordinary to 2 ranks 1:3");
  require_all(train(s1.path(), "none", {49}, {}, 20), "sharded to 1 rank none");
  require_all(train(o1.path(), "none", {49}, {}, 20), "ordinary to 1 rank none");
  require_all(train(straight.path(), "none", kThree, {}, 20), "uninterrupted none");
  const auto reference = mnist_params_of(straight / "ck/checkpoint_last.pt");
  const auto a = mnist_params_of(s2 / "ck/checkpoint_last.pt"), a_ordinary = mnist_params_of(o2 / "ck/checkpoint_last.pt");
  const auto b = mnist_params_of(s1 / "ck/checkpoint_last.pt"), b_ordinary = mnist_params_of(o1 / "ck/checkpoint_last.pt");
  for (size_t i = 0; i < reference.size(); ++i) {
    INFO("parameter " << i);
    CHECK(torch::equal(a[i], a_ordinary[i]));
    CHECK(torch::equal(b[i], b_ordinary[i]));
    // Relative in norm: ||x - reference|| / ||reference||.
    const double norm = reference[i].norm().item<double>();
    const double da = (a[i] - reference[i]).norm().item<double>() / norm;
    const double db = (b[i] - reference[i]).norm().item<double>() / norm;
    INFO("relative difference: 2 ranks " << da << ", 1 rank " << db);
    CHECK(da <= 1e-6);
    CHECK(db <= 1e-6);
  }
  // The 1-rank run wrote an ordinary checkpoint over the sharded one and removed the shard set.
  for (const auto& e : fs::directory_iterator(s1 / "ck")) {
    CHECK(e.path().filename().string().find(".shard-") == std::string::npos);
  }
}

TEST_CASE("A sharded checkpoint missing a shard, with a damaged shard or with another run's manifest is refused in "
          "one line naming the file, and nothing is overwritten",
          "[distributed][multiprocess][zero_shard][checkpoint]") {
  // The two runs to damage, once for all sections (Catch runs the test's body again for each section).
  static const TempDir dir, other;
  static const bool trained = [] {
    require_all(train(dir.path(), "os", kThree, kBudgets112, 3), "os to 3");
    require_all(train(other.path(), "os", kThree, kBudgets112, 3, {"--seed", "5"}), "another run");
    return true;
  }();
  (void)trained;
  const fs::path last = dir / "ck/checkpoint_last.pt";
  const std::string id = hetseq::load_checkpoint(last).optimizer_shards->save_id;
  const std::string other_id = hetseq::load_checkpoint(other / "ck/checkpoint_last.pt").optimizer_shards->save_id;
  const fs::path manifest = hetseq::manifest_path(last, id);
  const fs::path shard1 = hetseq::shard_file_path(last, id, 1, 3), shard2 = hetseq::shard_file_path(last, id, 2, 3);

  struct Case {
    std::string name;
    std::function<void(const fs::path& ck)> damage;
    std::string line;  // the error, after "hetseq-train: error: "
  };
  const auto size2 = fs::file_size(shard2);
  std::vector<Case> cases{
      {"missing shard", [&](const fs::path& ck) { fs::remove(ck / shard1.filename()); },
       fmt::format("{0}: missing or unreadable: rank 1's optimizer shard of {1} (save {2}, listed in {3}), so the "
                   "checkpoint is incomplete; restore the file, resume from another checkpoint, or pass "
                   "--reset-optimizer",
                   "CK/" + shard1.filename().string(), "CK/checkpoint_last.pt", id,
                   "CK/" + manifest.filename().string())},
      {"damaged shard",
       [&](const fs::path& ck) {
         std::fstream f(ck / shard2.filename(), std::ios::in | std::ios::out | std::ios::binary);
         f.seekg(static_cast<std::streamoff>(size2 / 2));
         const char c = static_cast<char>(f.get());
         f.seekp(static_cast<std::streamoff>(size2 / 2));
         f.put(static_cast<char>(c ^ 0x10));
       },
       "CK/" + shard2.filename().string() + ": " + std::to_string(size2) + " bytes with CRC-32 "},
      {"another run's manifest",
       [&](const fs::path& ck) {
         fs::copy_file(hetseq::manifest_path(other / "ck/checkpoint_last.pt", other_id), ck / manifest.filename(),
                       fs::copy_options::overwrite_existing);
       },
       fmt::format("{}: from save {} (3 ranks, 3 updates), but {} is save {} (3 ranks, 3 updates): the manifest "
                   "belongs to another run or checkpoint; restore this checkpoint's own manifest, or pass "
                   "--reset-optimizer",
                   "CK/" + manifest.filename().string(), other_id, "CK/checkpoint_last.pt", id)},
  };
  for (const Case& c : cases) {
    SECTION(c.name) {
      TempDir run;
      fs::copy(dir / "ck", run / "ck", fs::copy_options::recursive);
      c.damage(run / "ck");
      const auto before = contents(run / "ck");
      const auto ranks = train(run.path(), "os", kThree, kBudgets112, 6);
      std::string expected = c.line;
      // Past each replacement: a temporary directory whose random name ends in "CK" would match again.
      const std::string ck = run / "ck/";
      for (size_t at = 0; (at = expected.find("CK/", at)) != std::string::npos; at += ck.size()) {
        expected.replace(at, 3, ck);
      }
      for (size_t r = 0; r < ranks.size(); ++r) {
        INFO("rank " << r << " stderr:\n" << ranks[r].err);
        CHECK(ranks[r].exit_code == hetseq::kExitInput);
        const std::string line = line_with(ranks[r].err, "hetseq-train: error: ");
        CHECK(line.rfind("hetseq-train: error: " + expected, 0) == 0);
      }
      CHECK(contents(run / "ck") == before);  // nothing written, nothing removed
    }
  }
}

TEST_CASE("SIGKILL during a sharded save leaves the previous checkpoint loadable, and retention removes shard sets",
          "[distributed][multiprocess][zero_shard][checkpoint]") {
  // Saves after updates 2 and 4 (checkpoint_1_N.pt and checkpoint_last.pt, the last interval file kept).
  // Per save, rank 0 writes 8 files: its shard (1), checkpoint_1_N's manifest (2), the 3 shards' copies for
  // checkpoint_last (3-5) and its manifest (6), checkpoint_1_N.pt (7) and its copy to checkpoint_last.pt (8);
  // ranks 1 and 2 write their shard (1). The second save is held at a known write (Note [Save pause]) and
  // every rank killed.
  struct Point {
    int rank;
    int write;
    std::string file;  // the held file's name ends so
  };
  const std::vector<Point> points{{1, 2, ".shard-1-of-3.pt"}, {0, 14, ".manifest.json"}, {0, 16, "/checkpoint_last.pt"}};
  TempDir straight;
  require_all(train(straight.path(), "os", kThree, kBudgets112, 6), "uninterrupted os to 6");
  for (const Point& point : points) {
    CAPTURE(point.rank, point.write);
    TempDir dir;
    const SavePause pause(dir / "pause");
    auto cmds = commands(dir.path(), "os", kThree, kBudgets112, 100,
                         {"--save-interval-updates", "2", "--keep-interval-updates", "1"});
    std::vector<std::unique_ptr<Process>> ranks;
    for (size_t r = 0; r < cmds.size(); ++r) {
      std::map<std::string, std::string> env;
      if (static_cast<int>(r) == point.rank) env[kSavePauseEnv] = pause.at(point.write);
      ranks.push_back(std::make_unique<Process>(env.empty() ? cmds[r] : hooked(cmds[r]), env));
    }
    Process& held = *ranks[static_cast<size_t>(point.rank)];
    REQUIRE(held.wait_for_err("[save-pause]", 120s));
    const std::string said = line_with(held.err_so_far(), "[save-pause]");
    CHECK_THAT(said, Contains(fmt::format("checkpoint write {} ({}/ck/", point.write, dir.path())));
    CHECK_THAT(said, Contains(point.file + ") paused"));
    for (auto& p : ranks) p->kill();
    for (auto& p : ranks) p->wait(30s);

    // The previous save is whole: checkpoint_last.pt of update 2, its manifest and shards check out.
    const fs::path last = dir / "ck/checkpoint_last.pt";
    CHECK(hetseq::load_checkpoint(last).num_updates == 2);
    const auto shards = open_shards(last);
    CHECK(shards->manifest().num_updates == 2);

    // And it resumes: to update 6, the uninterrupted run's parameters bit for bit.
    const auto resumed = train(dir.path(), "os", kThree, kBudgets112, 6,
                               {"--save-interval-updates", "2", "--keep-interval-updates", "1"});
    require_all(resumed, "resumed");
    CHECK_THAT(resumed[0].err, Contains("resumed from") && Contains("2 updates done"));
    const auto expected = mnist_params_of(straight / "ck/checkpoint_last.pt");
    const auto got = mnist_params_of(last);
    for (size_t i = 0; i < expected.size(); ++i) CHECK(torch::equal(got[i], expected[i]));
    // Retention: checkpoint_1_6.pt and checkpoint_last.pt, each with its manifest and 3 shards, and
    // nothing of the killed save or of the checkpoints that retention removed.
    const std::string id6 = hetseq::load_checkpoint(dir / "ck/checkpoint_1_6.pt").optimizer_shards->save_id;
    const std::string id_last = hetseq::load_checkpoint(last).optimizer_shards->save_id;
    CHECK(id6 == id_last);
    std::set<std::string> want{"checkpoint_1_6.pt", "checkpoint_last.pt"};
    for (const std::string stem : {"checkpoint_1_6", "checkpoint_last"}) {
      want.insert(fmt::format("{}.{}.manifest.json", stem, id6));
      for (int r = 0; r < 3; ++r) want.insert(fmt::format("{}.{}.shard-{}-of-3.pt", stem, id6, r));
    }
    std::set<std::string> present;
    for (const auto& e : fs::directory_iterator(dir / "ck")) present.insert(e.path().filename().string());
    CHECK(present == want);
  }
}
