// The Tracer and the trace merge (level 1): the window, the file's events, and what merging accepts.
// See Note [Tracing].
#include <chrono>
#include <fstream>
#include <thread>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "hetseq/core/error.h"
#include "hetseq/observe/trace_merge.h"
#include "hetseq/observe/tracer.h"
#include "support/run_output.h"
#include "support/temp_dir.h"

using namespace hetseq;
using namespace hetseq::test;

namespace {

// The complete ("X") events of a trace, as "name tid index" (index -1 when none), sorted.
std::vector<std::string> spans(const nlohmann::json& doc) {
  std::vector<std::string> out;
  for (const auto& e : doc["traceEvents"]) {
    if (e["ph"] != "X") continue;
    out.push_back(e["name"].get<std::string>() + " " + std::to_string(e["tid"].get<int>()) + " " +
                  std::to_string(e["args"].value("index", int64_t{-1})));
  }
  std::sort(out.begin(), out.end());
  return out;
}

ClockAlignment clock_at(int64_t system_us, std::vector<int64_t> offsets) {
  ClockAlignment c;
  c.system_us = system_us;
  c.offsets_us = std::move(offsets);
  return c;
}

}  // namespace

TEST_CASE("The trace window flag is A:B with 1 <= A <= B", "[observe][trace]") {
  TraceOptions t;
  parse_trace_window("5:8", t);
  CHECK(t.first_update == 5);
  CHECK(t.last_update == 8);
  for (const std::string bad : {"8:5", "0:3", "5", "a:b", "3:", ":4", "-1:2"}) {
    INFO(bad);
    CHECK_THROWS_MATCHES(parse_trace_window(bad, t), UsageError,
                         Catch::Matchers::Message("--trace-updates " + bad +
                                                  ": expected A:B, the first and last update to trace (1 <= A <= B), "
                                                  "e.g. 100:120"));
  }
}

TEST_CASE("A tracer keeps the spans of its window only and writes them when the window ends", "[observe][trace]") {
  TempDir dir;
  TraceOptions o;
  o.dir = dir / "trace";
  o.first_update = 2;
  o.last_update = 3;
  o.rank = 1;
  o.label = "rank 1 (test)";
  Tracer tracer(o);
  REQUIRE(tracer.path() == dir / "trace/trace_rank1.json");
  const auto t0 = Tracer::Clock::now();
  tracer.begin_update(1);
  { const TraceSpan s(&tracer, "before"); }
  CHECK(!tracer.recording());
  tracer.begin_update(2);
  CHECK(tracer.recording());
  {
    const TraceSpan outer(&tracer, "update", 2);
    const TraceSpan inner(&tracer, "forward", 0);
  }
  // From another thread, as the backend's threads add bucket allreduces.
  std::thread([&] { tracer.add_span("allreduce", kBucketTrack + 3, t0, Tracer::Clock::now(), 3, 4096); }).join();
  tracer.begin_update(3);
  { const TraceSpan s(&tracer, "update", 3); }
  CHECK(!std::filesystem::exists(tracer.path()));  // still inside the window
  tracer.begin_update(4);                           // past it: written
  REQUIRE(std::filesystem::exists(tracer.path()));
  CHECK(!tracer.recording());
  { const TraceSpan s(&tracer, "after"); }
  { const TraceSpan none(nullptr, "no tracer"); }
  tracer.finish();  // a second time: nothing more

  const nlohmann::json doc = read_json_file(tracer.path());
  CHECK(spans(doc) == std::vector<std::string>{"allreduce 103 -1", "forward 1 0", "update 1 2", "update 1 3"});
  CHECK(doc["otherData"]["rank"] == 1);
  CHECK(doc["otherData"]["trace_updates"] == "2:3");
  bool named = false, bucket_named = false;
  for (const auto& e : doc["traceEvents"]) {
    if (e["ph"] == "X") {
      CHECK(e["pid"] == 1);
      CHECK(e["args"]["clock"] == "host");
      if (e["name"] == "allreduce") {
        CHECK(e["args"]["bucket"] == 3);
        CHECK(e["args"]["bytes"] == 4096);
      }
    }
    if (e["ph"] == "M" && e["name"] == "process_name") named = e["args"]["name"] == "rank 1 (test)";
    if (e["ph"] == "M" && e["name"] == "thread_name" && e["tid"] == kBucketTrack + 3) {
      bucket_named = e["args"]["name"] == "allreduce bucket 3 (host)";
    }
  }
  CHECK(named);
  CHECK(bucket_named);
}

TEST_CASE("Merging traces gives one file with every rank and refuses other runs and repeated ranks", "[observe][trace]") {
  TempDir dir;
  const int64_t zero = 1'795'000'000'000'000;
  auto write_rank = [&](const std::string& sub, int64_t rank, int64_t system_us, std::vector<int64_t> offsets) {
    TraceOptions o;
    o.dir = dir / sub;
    o.first_update = 1;
    o.last_update = 1;
    o.rank = rank;
    Tracer t(o);
    t.set_clock(clock_at(system_us, std::move(offsets)));
    t.begin_update(1);
    { const TraceSpan s(&t, "update", 1); }
    t.finish();
    return t.path();
  };
  // Rank 1's system clock runs 2.5 s ahead of rank 0's: the same run all the same.
  const std::string r0 = write_rank("run", 0, zero, {0, 2'500'000});
  const std::string r1 = write_rank("run", 1, zero + 2'500'000, {0, 2'500'000});
  const std::vector<std::string> files = find_trace_files({dir / "run"});
  CHECK(files == std::vector<std::string>{r0, r1});
  CHECK(merge_traces(files, dir / "run/trace.json") > 0);
  const nlohmann::json merged = read_json_file(dir / "run/trace.json");
  std::set<int64_t> pids;
  for (const auto& e : merged["traceEvents"]) {
    if (e["ph"] == "X") pids.insert(e["pid"].get<int64_t>());
  }
  CHECK(pids == std::set<int64_t>{0, 1});
  // The merged file is not taken for a rank's trace when the directory is merged again.
  CHECK(find_trace_files({dir / "run"}).size() == 2);

  const std::string other = write_rank("other", 1, zero + 100'000'000, {0, 0});
  CHECK_THROWS_MATCHES(merge_traces({r0, other}, dir / "x.json"), InputError,
                       Catch::Matchers::Message(r0 + " and " + other +
                                                " come from different runs (their time zeros are 100.0 s apart); "
                                                "merge the traces of one run"));
  CHECK_THROWS_MATCHES(merge_traces({r0, r0}, dir / "x.json"), InputError,
                       Catch::Matchers::Message(r0 + " and " + r0 + " both hold rank 0: merge the traces of one run"));
  CHECK_THROWS_MATCHES(find_trace_files({dir / "missing"}), InputError,
                       Catch::Matchers::Message(dir / "missing" + ": no such trace file or directory"));
  CHECK(!std::filesystem::exists(dir / "x.json"));
}
