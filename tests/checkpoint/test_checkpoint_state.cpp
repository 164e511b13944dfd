// The checkpoint entries of the CUDA generators and of PowerSGD (Note [Checkpoint file]): they round-trip
// through a file, Python reads them with torch.load, a damaged PowerSGD entry is a clear error, and a file of an
// earlier hetseq without them still loads. The Controller's side on this machine: no CUDA states to save, and
// none restored.
#include <zlib.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/torch.h>

#include "hetseq/checkpoint/checkpoint_file.h"
#include "hetseq/checkpoint/checkpoint_format.h"
#include "hetseq/checkpoint/resume_check.h"
#include "hetseq/checkpoint/torch_archive.h"
#include "hetseq/checkpoint/training_state.h"
#include "support/error_message.h"
#include "support/subprocess.h"
#include "support/temp_dir.h"
#include "support/test_paths.h"

using Catch::Contains;
using hetseq::Checkpoint;
using hetseq::PowerSgdState;
using hetseq::test::input_error_of;
using hetseq::test::TempDir;

namespace {

using Dict = c10::impl::GenericDict;

PowerSgdState sample_powersgd() {
  torch::manual_seed(21);
  PowerSgdState p;
  p.update = 41;
  p.world_size = 3;
  PowerSgdState::Bucket b0;
  b0.index = 0;
  b0.shapes = {{16, 12}, {12}, {10, 8}};
  b0.matrices = {0, 2};
  b0.q = {torch::randn({12, 2}), torch::randn({8, 2})};
  b0.errors = {torch::randn({3, 16, 12}), torch::randn({3, 10, 8})};
  PowerSgdState::Bucket b1;
  b1.index = 1;
  b1.shapes = {{4, 5, 6}};
  b1.matrices = {0};
  b1.q = {torch::randn({30, 1}, torch::kFloat64)};
  b1.errors = {torch::randn({3, 4, 30}, torch::kFloat64)};
  p.buckets = {b0, b1};
  return p;
}

Checkpoint state_checkpoint() {
  torch::manual_seed(20);
  Checkpoint c;
  c.model = {{"fc.weight", torch::randn({4, 3})}};
  c.optimizer_name = "sgd";
  c.lr_scheduler_name = "fixed";
  c.rng_state = torch::randint(0, 255, {5056}, torch::kUInt8);
  c.cuda_rng_states = {torch::randint(0, 255, {16}, torch::kUInt8), torch::randint(0, 255, {16}, torch::kUInt8)};
  c.powersgd = sample_powersgd();
  c.data_plan = {{8, 16}, {1, 1}};
  c.task = "mnist";
  return c;
}

bool same_tensors(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].scalar_type() != b[i].scalar_type() || !torch::equal(a[i], b[i])) return false;
  }
  return true;
}

// The checksum of Note [Checkpoint file], written here from the Note, not from the code: a CRC-32 over every
// entry but `checksum`, dict keys in sorted order.
class NoteCrc {
 public:
  void bytes(const void* p, size_t n) { crc_ = crc32(crc_, static_cast<const Bytef*>(p), static_cast<uInt>(n)); }
  void integer(int64_t v) { bytes(&v, sizeof v); }
  void text(const std::string& s) {
    integer(static_cast<int64_t>(s.size()));
    bytes(s.data(), s.size());
  }
  void value(const c10::IValue& v) {
    if (v.isTensor()) {
      const torch::Tensor t = v.toTensor().contiguous();
      integer(static_cast<int64_t>(t.scalar_type()));
      integer(t.dim());
      for (int64_t s : t.sizes()) integer(s);
      bytes(t.data_ptr(), t.nbytes());
    } else if (v.isDouble()) {
      integer(1);
      const double d = v.toDouble();
      bytes(&d, sizeof d);
    } else if (v.isInt()) {
      integer(2);
      integer(v.toInt());
    } else if (v.isBool()) {
      integer(3);
      integer(v.toBool() ? 1 : 0);
    } else if (v.isString()) {
      integer(4);
      text(v.toStringRef());
    } else if (v.isNone()) {
      integer(5);
    } else if (v.isGenericDict()) {
      integer(6);
      std::vector<std::string> keys;
      for (const auto& e : v.toGenericDict()) keys.push_back(e.key().toStringRef());
      std::sort(keys.begin(), keys.end());
      integer(static_cast<int64_t>(keys.size()));
      for (const auto& k : keys) {
        text(k);
        value(v.toGenericDict().at(k));
      }
    } else {
      REQUIRE(v.isList());
      integer(7);
      integer(static_cast<int64_t>(v.toList().size()));
      for (const c10::IValue& e : v.toList()) value(e);
    }
  }
  int64_t result() const { return static_cast<int64_t>(crc_); }

 private:
  uLong crc_ = crc32(0L, Z_NULL, 0);
};

// The file an earlier hetseq wrote for `c`: its archive without the entries `drop` of extra_state, checksummed
// anew.
std::vector<char> without_extra_entries(const Checkpoint& c, const std::vector<std::string>& drop) {
  const c10::IValue decoded = torch::pickle_load(hetseq::encode_checkpoint(c));
  const Dict root = decoded.toGenericDict();
  Dict old(c10::StringType::get(), c10::AnyType::get());
  for (const auto& e : root) {
    if (e.key().toStringRef() == "checksum") continue;
    if (e.key().toStringRef() != "extra_state") {
      old.insert(e.key(), e.value());
      continue;
    }
    Dict extra(c10::StringType::get(), c10::AnyType::get());
    for (const auto& x : e.value().toGenericDict()) {
      if (std::find(drop.begin(), drop.end(), x.key().toStringRef()) == drop.end()) extra.insert(x.key(), x.value());
    }
    old.insert("extra_state", extra);
  }
  NoteCrc crc;
  crc.value(old);
  old.insert("checksum", crc.result());
  return hetseq::detail::archive_bytes(old);
}

}  // namespace

TEST_CASE("a checkpoint reads back the CUDA generators' states and PowerSGD's state exactly", "[checkpoint]") {
  TempDir dir;
  const Checkpoint c = state_checkpoint();
  hetseq::save_checkpoint(c, {dir / "state.pt"});
  const Checkpoint r = hetseq::load_checkpoint(dir / "state.pt");
  CHECK(same_tensors(r.cuda_rng_states, c.cuda_rng_states));
  REQUIRE(r.powersgd);
  CHECK(r.powersgd->update == 41);
  CHECK(r.powersgd->world_size == 3);
  REQUIRE(r.powersgd->buckets.size() == 2);
  for (size_t b = 0; b < 2; ++b) {
    CAPTURE(b);
    const auto &got = r.powersgd->buckets[b], &want = c.powersgd->buckets[b];
    CHECK(got.index == want.index);
    CHECK(got.shapes == want.shapes);
    CHECK(got.matrices == want.matrices);
    CHECK(same_tensors(got.q, want.q));
    CHECK(same_tensors(got.errors, want.errors));
  }
  // The in-memory encoding and the streamed save are the same bytes (Note [Streamed save]).
  std::ifstream in(dir / "state.pt", std::ios::binary);
  const std::vector<char> file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK(file == hetseq::encode_checkpoint(c));

  Checkpoint none = c;
  none.cuda_rng_states.clear();
  none.powersgd.reset();
  const Checkpoint n = hetseq::decode_checkpoint(hetseq::encode_checkpoint(none), "none.pt");
  CHECK(n.cuda_rng_states.empty());
  CHECK(!n.powersgd);
}

TEST_CASE("a checkpoint of an earlier hetseq, without CUDA generator or PowerSGD entries, still loads",
          "[checkpoint]") {
  Checkpoint c = state_checkpoint();
  c.powersgd.reset();
  const std::vector<char> old = without_extra_entries(c, {"cuda_rng_state", "powersgd"});
  const Checkpoint r = hetseq::decode_checkpoint(old, "old.pt");
  CHECK(r.cuda_rng_states.empty());
  CHECK(!r.powersgd);
  CHECK(torch::equal(r.rng_state, c.rng_state));
  CHECK(hetseq::state_digest(r) == hetseq::state_digest(c));
  // The test's own checksum is the decoder's: with the entries kept, the file decodes as written.
  const Checkpoint kept = hetseq::decode_checkpoint(without_extra_entries(state_checkpoint(), {}), "new.pt");
  CHECK(same_tensors(kept.cuda_rng_states, c.cuda_rng_states));
}

TEST_CASE("a PowerSGD entry whose parts do not fit together is an error naming the file and the bucket",
          "[checkpoint]") {
  Checkpoint c = state_checkpoint();
  c.powersgd->buckets[1].errors[0] = torch::randn({2, 4, 30});  // errors of 2 ranks in a state of 3
  CHECK_THAT(input_error_of([&] { hetseq::decode_checkpoint(hetseq::encode_checkpoint(c), "bad.pt"); }),
             Contains("bad.pt: PowerSGD bucket 1, matrix 0: view 0 of 1, Q of shape [30, 1], errors of shape "
                      "[2, 4, 30] for 3 ranks do not fit together"));
  c = state_checkpoint();
  c.powersgd->buckets[0].q.pop_back();
  CHECK_THAT(input_error_of([&] { hetseq::decode_checkpoint(hetseq::encode_checkpoint(c), "bad.pt"); }),
             Contains("bad.pt: PowerSGD bucket 0 has 2 matrices but 1 Q and 2 error tensors"));
  c = state_checkpoint();
  c.powersgd->world_size = 0;
  CHECK_THAT(input_error_of([&] { hetseq::decode_checkpoint(hetseq::encode_checkpoint(c), "bad.pt"); }),
             Contains("bad.pt: the PowerSGD state (update 41, 0 ranks) is impossible"));
}

TEST_CASE("Python reads the CUDA generator and PowerSGD entries of a checkpoint with torch.load",
          "[checkpoint][python]") {
  const std::string python = hetseq::test::python_path();
  REQUIRE(!python.empty());
  TempDir dir;
  hetseq::save_checkpoint(state_checkpoint(), {dir / "state.pt"});
  const std::string script =
      "import sys, torch\n"
      "x = torch.load(sys.argv[1], weights_only=True, map_location='cpu')['extra_state']\n"
      "p = x['powersgd']\n"
      "print(len(x['cuda_rng_state']), p['update'], p['world_size'], "
      "[list(e.shape) for b in p['buckets'] for e in b['errors']], p['buckets'][1]['shapes'])\n";
  const auto r = hetseq::test::run_process({python, "-c", script, dir / "state.pt"}, std::chrono::seconds(120));
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(r.out == "2 41 3 [[3, 16, 12], [3, 10, 8], [3, 4, 30]] [[4, 5, 6]]\n");
}

TEST_CASE("without CUDA a training state has no CUDA generator states, and saved ones are not restored",
          "[checkpoint]") {
  if (torch::cuda::is_available()) {
    WARN("this process sees CUDA: the CPU-only behaviour is checked where there is none");
    return;
  }
  CHECK(hetseq::cuda_rng_states().empty());
  CHECK(hetseq::set_cuda_rng_states(state_checkpoint().cuda_rng_states, "ck.pt") == 0);
}
