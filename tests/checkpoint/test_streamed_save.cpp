// Streamed checkpoint saves (see Note [Streamed save]): the file holds exactly the bytes of the in-memory
// encoding for every kind of tensor layout, Python reads it, a failed write leaves the previous file,
// and the host memory a save of more than 1 GiB of state takes is measured in a child process.
#include <signal.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <regex>
#include <sstream>

#include <catch2/catch.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "hetseq/checkpoint/atomic_file.h"
#include "hetseq/checkpoint/checkpoint_file.h"
#include "hetseq/checkpoint/checkpoint_format.h"
#include "hetseq/checkpoint/resume_check.h"
#include "cuda/cuda_skip.h"
#include "support/error_message.h"
#include "support/subprocess.h"
#include "support/temp_dir.h"
#include "support/test_paths.h"

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using Catch::Contains;
using hetseq::Checkpoint;
using hetseq::test::TempDir;
using hetseq::test::input_error_of;

namespace {

// A checkpoint whose tensors take every path of the streamed writer: contiguous, transposed, expanded
// (overlapping), a slice of a larger tensor (the whole storage is written), two tensors of one
// storage (written once), odd strides on a size-1 dimension, empty, several dtypes; with `cuda`, also
// CUDA tensors (contiguous and transposed), which the writer copies to the host as it streams them.
Checkpoint layouts_checkpoint(bool cuda = false) {
  torch::manual_seed(3);
  const torch::Tensor shared = torch::randn({6, 5});
  Checkpoint c;
  c.model = {{"fc.weight", torch::randn({7, 3})},
             {"fc.weight_t", torch::randn({3, 7}).t()},
             {"expanded", torch::randn({4, 1}).expand({4, 6})},
             {"slice", shared.narrow(0, 2, 3)},
             {"slice_again", shared.narrow(0, 1, 2)},
             {"odd_stride", torch::randn({5, 1}).as_strided({5, 1}, {1, 7})},
             {"empty", torch::empty({0, 4})},
             {"half", torch::randn({9}).to(torch::kBFloat16)},
             {"count", torch::arange(11, torch::kInt64)},
             {"mask", torch::rand({3, 3}) > 0.5}};
  if (cuda) {
    c.model.emplace_back("cuda.weight", torch::randn({5, 4}, torch::kCUDA));
    c.model.emplace_back("cuda.weight_t", torch::randn({4, 5}, torch::kCUDA).t());
    c.model.emplace_back("cuda.slice", torch::randn({6, 5}, torch::kCUDA).narrow(0, 2, 3));
  }
  c.optimizer_name = "adam";
  c.optimizer_options = {{"beta1", 0.9}};
  c.optimizer_state = std::map<std::string, torch::Tensor>{{"param.0.exp_avg", torch::randn({3, 7}).t()},
                                                           {"lr", torch::tensor(0.5, torch::kFloat64)}};
  c.lr_scheduler_name = "FixedSchedule";
  c.num_updates = 9;
  c.rng_state = torch::randint(0, 255, {64}, torch::kUInt8);
  c.data_plan = {{8}, {1}};
  c.bucket_layout = {{0, 1}, {2}};
  c.task = "mnist";
  c.torch_version = "test";
  return c;
}

std::vector<char> file_bytes(const fs::path& path) { return hetseq::read_file(path); }

void check_same_tensors(const std::vector<std::pair<std::string, torch::Tensor>>& loaded,
                        const std::vector<std::pair<std::string, torch::Tensor>>& saved) {
  REQUIRE(loaded.size() == saved.size());
  for (size_t i = 0; i < saved.size(); ++i) {
    INFO(saved[i].first);
    CHECK(loaded[i].first == saved[i].first);
    CHECK(loaded[i].second.device().is_cpu());
    CHECK(torch::equal(loaded[i].second, saved[i].second.cpu()));
  }
}

// What the memory test saves: 4 x 256 MiB of contiguous parameters and a transposed 64 MiB optimizer
// buffer (copied while it is written), 1088 MiB in all.
constexpr int64_t kLargeSide = 8192;
constexpr int64_t kLargeBufferSide = 4096;

Checkpoint large_checkpoint() {
  torch::manual_seed(5);
  Checkpoint c;
  for (int i = 0; i < 4; ++i) c.model.emplace_back(fmt::format("w{}", i), torch::randn({kLargeSide, kLargeSide}));
  c.optimizer_name = "adam";
  c.optimizer_state =
      std::map<std::string, torch::Tensor>{{"param.0.exp_avg", torch::randn({kLargeBufferSide, kLargeBufferSide}).t()}};
  c.lr_scheduler_name = "FixedSchedule";
  c.num_updates = 1;
  c.rng_state = torch::randint(0, 255, {5056}, torch::kUInt8);
  c.task = "memory";
  return c;
}

int64_t state_bytes(const Checkpoint& c) {
  int64_t n = 0;
  for (const auto& [name, t] : c.model) n += static_cast<int64_t>(t.nbytes());
  for (const auto& [name, t] : *c.optimizer_state) n += static_cast<int64_t>(t.nbytes());
  return n;
}

// A figure of /proc/self/status in KiB (VmRSS: resident now, VmHWM: the peak).
int64_t status_kib(const std::string& key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key + ":", 0) == 0) return std::stoll(line.substr(key.size() + 1));
  }
  FAIL("/proc/self/status has no " << key);
  return -1;
}

// Resets VmHWM to the current resident size (Linux >= 4.0); false where that is refused.
bool reset_peak() {
  std::ofstream f("/proc/self/clear_refs");
  f << "5" << std::flush;
  return f.good();
}

constexpr const char* kChildDirVariable = "HETSEQ_TEST_CHECKPOINT_DIR";
constexpr const char* kChildTest = "streamed save child: save a large checkpoint and report the memory it took";

}  // namespace

TEST_CASE("a streamed save writes exactly the bytes of the in-memory encoding", "[checkpoint]") {
  TempDir dir;
  const Checkpoint c = layouts_checkpoint();
  const std::vector<char> encoded = hetseq::encode_checkpoint(c);
  hetseq::save_checkpoint(c, {dir / "checkpoint_2_9.pt", dir / "checkpoint_last.pt", dir / "checkpoint_best.pt"});
  for (const char* name : {"checkpoint_2_9.pt", "checkpoint_last.pt", "checkpoint_best.pt"}) {
    INFO(name);
    CHECK(file_bytes(dir / name) == encoded);
  }
  const Checkpoint r = hetseq::load_checkpoint(dir / "checkpoint_best.pt");
  check_same_tensors(r.model, c.model);
  REQUIRE(r.optimizer_state);
  CHECK(torch::equal(r.optimizer_state->at("param.0.exp_avg"), c.optimizer_state->at("param.0.exp_avg")));
  CHECK(torch::equal(r.rng_state, c.rng_state));
  CHECK(r.bucket_layout == c.bucket_layout);
  CHECK(hetseq::state_digest(r) == hetseq::state_digest(c));
  // The slices are stored with the whole tensor they view, once.
  CHECK(r.model[3].second.storage().is_alias_of(r.model[4].second.storage()));
  for (const auto& e : fs::directory_iterator(dir.path())) CHECK(e.path().filename().string()[0] != '.');
}

TEST_CASE("Python reads a streamed checkpoint of every tensor layout", "[checkpoint][python]") {
  const std::string python = hetseq::test::python_path();
  REQUIRE(!python.empty());  // the venv of scripts/setup.sh; set HETSEQ_PYTHON at configure time otherwise
  TempDir dir;
  const Checkpoint c = layouts_checkpoint();
  hetseq::save_checkpoint(c, {dir / "checkpoint_last.pt"});
  const auto r = hetseq::test::run_process(
      {python, hetseq::test::source_dir() + "/scripts/checkpoint_weights.py", dir / "checkpoint_last.pt",
       "--summary"},
      120s);
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  const auto summary = nlohmann::json::parse(r.out);
  REQUIRE(summary.size() == c.model.size());
  for (const auto& [name, t] : c.model) {
    INFO(name);
    REQUIRE(summary.contains(name));
    CHECK(summary[name]["shape"].get<std::vector<int64_t>>() == t.sizes().vec());
    CHECK(summary[name]["sum"].get<double>() == Approx(t.cpu().to(torch::kFloat64).sum().item<double>()).epsilon(1e-12));
  }
}

// The CUDA layouts of the two tests above: a CUDA tensor is copied to the host while it streams, so its
// bytes, the storage a slice shares, and the Python reader's view must be those of the host copy.
TEST_CASE("CUDA: a streamed save of CUDA tensors (contiguous, transposed, a slice) writes the bytes of the "
          "in-memory encoding, loads on the CPU, and Python reads it",
          "[cuda][checkpoint][python]") {
  if (!hetseq::test::cuda_or_skip()) return;
  TempDir dir;
  const Checkpoint c = layouts_checkpoint(/*cuda=*/true);
  REQUIRE(c.model.back().second.is_cuda());
  hetseq::save_checkpoint(c, {dir / "checkpoint_1_9.pt", dir / "checkpoint_last.pt"});
  const std::vector<char> encoded = hetseq::encode_checkpoint(c);
  CHECK(file_bytes(dir / "checkpoint_1_9.pt") == encoded);
  CHECK(file_bytes(dir / "checkpoint_last.pt") == encoded);
  const Checkpoint r = hetseq::load_checkpoint(dir / "checkpoint_last.pt");
  check_same_tensors(r.model, c.model);
  CHECK(hetseq::state_digest(r) == hetseq::state_digest(c));

  const std::string python = hetseq::test::python_path();
  REQUIRE(!python.empty());
  const auto p = hetseq::test::run_process(
      {python, hetseq::test::source_dir() + "/scripts/checkpoint_weights.py", dir / "checkpoint_last.pt",
       "--summary"},
      120s);
  INFO(p.err);
  REQUIRE(p.exit_code == 0);
  const auto summary = nlohmann::json::parse(p.out);
  for (const char* name : {"cuda.weight", "cuda.weight_t", "cuda.slice"}) {
    INFO(name);
    REQUIRE(summary.contains(name));
    const auto it = std::find_if(c.model.begin(), c.model.end(), [&](const auto& e) { return e.first == name; });
    REQUIRE(it != c.model.end());
    CHECK(summary[name]["shape"].get<std::vector<int64_t>>() == it->second.sizes().vec());
    CHECK(summary[name]["sum"].get<double>() ==
          Approx(it->second.cpu().to(torch::kFloat64).sum().item<double>()).epsilon(1e-12));
  }
}

TEST_CASE("a save that fails while writing leaves the previous checkpoint and no temporary file", "[checkpoint]") {
  TempDir dir;
  Checkpoint c = layouts_checkpoint();
  hetseq::save_checkpoint(c, {dir / "checkpoint_last.pt"});
  const std::vector<char> before = file_bytes(dir / "checkpoint_last.pt");
  c.num_updates = 10;
  c.model.emplace_back("big", torch::randn({256, 1024}));
  // A file size limit makes the write fail half way (EFBIG, with SIGXFSZ ignored), as a full disk does.
  struct rlimit old_limit {};
  REQUIRE(::getrlimit(RLIMIT_FSIZE, &old_limit) == 0);
  const auto old_handler = ::signal(SIGXFSZ, SIG_IGN);
  struct rlimit limit = old_limit;
  limit.rlim_cur = before.size() + 100000;
  REQUIRE(::setrlimit(RLIMIT_FSIZE, &limit) == 0);
  std::string message;
  try {
    hetseq::save_checkpoint(c, {dir / "checkpoint_last.pt", dir / "checkpoint_1_10.pt"});
  } catch (const hetseq::InputError& e) {
    message = e.what();
  }
  ::setrlimit(RLIMIT_FSIZE, &old_limit);
  ::signal(SIGXFSZ, old_handler);
  CHECK_THAT(message, Contains(dir / "checkpoint_last.pt") && Contains("unchanged"));
  CHECK(file_bytes(dir / "checkpoint_last.pt") == before);
  CHECK(!fs::exists(dir / "checkpoint_1_10.pt"));
  for (const auto& e : fs::directory_iterator(dir.path())) CHECK(e.path().filename().string()[0] != '.');
  // The same save succeeds once there is room.
  hetseq::save_checkpoint(c, {dir / "checkpoint_last.pt", dir / "checkpoint_1_10.pt"});
  CHECK(hetseq::load_checkpoint(dir / "checkpoint_1_10.pt").num_updates == 10);
}

TEST_CASE("a save into a directory that cannot hold files is an error naming the file and --save-dir",
          "[checkpoint]") {
  TempDir dir;
  std::ofstream(dir / "a-file") << "x";
  const std::string message =
      input_error_of([&] { hetseq::save_checkpoint(layouts_checkpoint(), {dir / "a-file/checkpoint_last.pt"}); });
  CHECK_THAT(message, Contains(dir / "a-file/checkpoint_last.pt") && Contains("--save-dir"));
}

// Run by the test below in a process of its own, so that the peak it reads is the save's.
TEST_CASE(kChildTest, "[.][checkpoint-memory-child]") {
  const char* dir = std::getenv(kChildDirVariable);
  REQUIRE(dir != nullptr);
  const Checkpoint c = large_checkpoint();
  // Where the peak cannot be reset, it also covers making the state, which in this process is about
  // the resident size before the save.
  const bool reset = reset_peak();
  const int64_t before = status_kib("VmRSS");
  const auto start = std::chrono::steady_clock::now();
  hetseq::save_checkpoint(c, {fs::path(dir) / "checkpoint_1_1.pt", fs::path(dir) / "checkpoint_last.pt"});
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::cout << "state_kib=" << state_bytes(c) / 1024 << " rss_before_kib=" << before
            << " peak_kib=" << status_kib("VmHWM") << " peak_reset=" << reset << " save_s=" << seconds << "\n";
}

TEST_CASE("a streamed save of more than 1 GiB of state grows resident memory by less than 20% of it",
          "[checkpoint][memory]") {
  TempDir dir;
  const auto r = hetseq::test::run_process({hetseq::test::binary_path("hetseq-tests"), kChildTest}, 300s,
                                           {{kChildDirVariable, dir.path()}});
  INFO("child stdout:\n" << r.out << "\nchild stderr:\n" << r.err);
  REQUIRE(!r.timed_out);
  REQUIRE(r.exit_code == 0);
  std::smatch m;
  REQUIRE(std::regex_search(r.out, m, std::regex(R"(state_kib=(\d+) rss_before_kib=(\d+) peak_kib=(\d+))")));
  const int64_t state = std::stoll(m[1]), before = std::stoll(m[2]), peak = std::stoll(m[3]);
  CHECK(state >= 1024 * 1024);
  const int64_t growth = peak - before;
  INFO("state " << state / 1024 << " MiB, resident before the save " << before / 1024 << " MiB, peak "
                << peak / 1024 << " MiB, growth " << growth / 1024 << " MiB");
  CHECK(growth * 5 < state);

  // The file holds the state, and the second name is a copy of it, byte for byte (compared in pieces
  // rather than decoded a second time).
  const Checkpoint expected = large_checkpoint();
  const Checkpoint loaded = hetseq::load_checkpoint(dir / "checkpoint_1_1.pt");
  check_same_tensors(loaded.model, expected.model);
  REQUIRE(loaded.optimizer_state);
  CHECK(torch::equal(loaded.optimizer_state->at("param.0.exp_avg"), expected.optimizer_state->at("param.0.exp_avg")));
  std::ifstream a(dir / "checkpoint_1_1.pt", std::ios::binary), b(dir / "checkpoint_last.pt", std::ios::binary);
  REQUIRE((a && b));
  CHECK(fs::file_size(dir / "checkpoint_1_1.pt") == fs::file_size(dir / "checkpoint_last.pt"));
  std::vector<char> x(1 << 20), y(1 << 20);
  bool same = true;
  while (same && a && b) {
    a.read(x.data(), static_cast<std::streamsize>(x.size()));
    b.read(y.data(), static_cast<std::streamsize>(y.size()));
    same = a.gcount() == b.gcount() && std::equal(x.begin(), x.begin() + a.gcount(), y.begin());
  }
  CHECK(same);
}
