// The loss scaler's state in checkpoints: every counter and the window round-trip, and a resume under
// another window carries the count toward it as the same share. See Note [Loss scale window on resume].
#include <map>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "hetseq/core/error.h"
#include "hetseq/core/logging.h"
#include "hetseq/train/loss_scaler.h"
#include "support/error_message.h"
#include "support/loss_scaler_steps.h"

using Catch::Contains;
using hetseq::DynamicLossScaler;
using hetseq::LossScalerOptions;
using hetseq::test::error_of;
using hetseq::test::scaler_options;
using hetseq::test::scales_after;

namespace {

LossScalerOptions window_of(int64_t window, double init = 64) { return scaler_options(init, window); }

bool logged(const std::vector<std::string>& lines, const std::string& text) {
  for (const auto& l : lines) {
    if (l.find(text) != std::string::npos) return true;
  }
  return false;
}

}  // namespace

TEST_CASE("the loss scaler's state holds every counter and its window, and a resume mid-window continues exactly",
          "[precision][checkpoint]") {
  DynamicLossScaler a(window_of(4));
  scales_after(a, {0, 1, 0, 0, 1, 0, 0});  // two overflows, then 2 of the window's 4 clean updates
  const auto saved = a.state();
  CHECK(saved == std::map<std::string, double>{{"scale", 16},
                                               {"clean_updates", 2},
                                               {"updates_since_rescale", 2},
                                               {"overflows_since_rescale", 0},
                                               {"overflows", 2},
                                               {"scale_window", 4}});
  DynamicLossScaler b(window_of(4));
  b.load_state(saved, "ck.pt");
  CHECK(b.state() == saved);
  const std::vector<int> next{0, 0, 0, 0, 0, 0, 1, 0};
  // The window's last 2 updates, then a full window: the scale doubles after updates 2 and 6.
  CHECK(scales_after(b, next) == std::vector<double>{16, 32, 32, 32, 32, 64, 32, 32});
  scales_after(a, next);
  CHECK(b.state() == a.state());  // the run that did not stop
}

TEST_CASE("a loss scaler resumed under another window carries its clean updates as the same share of the window",
          "[precision][checkpoint]") {
  DynamicLossScaler saved_run(window_of(8));
  scales_after(saved_run, {1, 0, 0, 0, 0, 0});  // 5 of the window's 8 updates without overflow
  const auto saved = saved_run.state();
  REQUIRE(saved.at("clean_updates") == 5);

  SECTION("a smaller window (more micro-batches per update): 5 of 8 become 2 of 4, not 5 (at once) or 0") {
    DynamicLossScaler b(window_of(4));
    hetseq::log::begin_capture();
    b.load_state(saved, "ck.pt");
    const auto lines = hetseq::log::end_capture();
    CHECK(b.state().at("clean_updates") == 2);
    CHECK(b.state().at("scale_window") == 4);
    CHECK(scales_after(b, {0, 0, 0}) == std::vector<double>{32, 64, 64});
    CHECK(logged(lines, "ck.pt: the loss scale window is 4 updates now and was 8 when saved"));
    CHECK(logged(lines, "the 5 updates without overflow toward it count as 2, the same share of the window"));
  }
  SECTION("a larger window (fewer micro-batches per update): 5 of 8 become 10 of 16") {
    DynamicLossScaler b(window_of(16));
    b.load_state(saved, "ck.pt");
    CHECK(b.state().at("clean_updates") == 10);
    std::vector<double> expected(6, 32);
    expected.back() = 64;  // updates 11 to 16 of the window
    CHECK(scales_after(b, {0, 0, 0, 0, 0, 0}) == expected);
  }
  SECTION("the same window: the counters as saved, nothing logged") {
    DynamicLossScaler b(window_of(8));
    hetseq::log::begin_capture();
    b.load_state(saved, "ck.pt");
    CHECK(hetseq::log::end_capture().empty());
    CHECK(b.state() == saved);
  }
  SECTION("the scale and the overflow counters do not depend on the split: kept as saved") {
    DynamicLossScaler b(window_of(3));
    b.load_state(saved, "ck.pt");
    auto got = b.state();
    auto want = saved;
    got.erase("clean_updates");
    got.erase("scale_window");
    want.erase("clean_updates");
    want.erase("scale_window");
    CHECK(got == want);
    CHECK(b.state().at("clean_updates") == 1);  // floor(5 * 3 / 8)
  }
}

TEST_CASE("a loss scaler state without a window (an earlier hetseq's) loads as counted under this run's window",
          "[precision][checkpoint]") {
  auto old = DynamicLossScaler(window_of(8)).state();
  old.erase("scale_window");
  old["clean_updates"] = 5;
  DynamicLossScaler b(window_of(4));
  hetseq::log::begin_capture();
  b.load_state(old, "old.pt");
  const auto lines = hetseq::log::end_capture();
  CHECK(b.state().at("clean_updates") == 5);
  CHECK(logged(lines, "old.pt: the loss scaler's state has no scale window (written by an earlier hetseq): its 5 "
                      "updates without overflow count toward this run's window of 4"));

  auto bad = DynamicLossScaler(window_of(8)).state();
  bad["scale_window"] = 2.5;
  CHECK_THAT(error_of<hetseq::InputError>([&] { b.load_state(bad, "bad.pt"); }),
             Contains("bad.pt: the loss scaler's saved window 2.5 is not a positive whole number of updates"));
  bad["scale_window"] = 0;
  CHECK_THAT(error_of<hetseq::InputError>([&] { b.load_state(bad, "bad.pt"); }), Contains("saved window 0"));
}
