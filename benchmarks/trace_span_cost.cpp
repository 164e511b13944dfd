// What one trace span costs the training thread (see Note [Tracing]): a TraceSpan with no tracer
// (--trace-dir off), with a tracer outside its window, and recording inside it; and add_span from
// another thread, as the bucket allreduces do. Prints nanoseconds per span, the median of 7 rounds.
//
//   build/bin/trace-span-cost [SPANS_PER_ROUND]   (default 50000)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include <unistd.h>

#include "hetseq/observe/tracer.h"

namespace {

using Clock = std::chrono::steady_clock;

template <class F>
double ns_per_span(int64_t n, F&& body) {
  std::vector<double> rounds;
  for (int r = 0; r < 7; ++r) {
    const auto t0 = Clock::now();
    for (int64_t i = 0; i < n; ++i) body(i);
    rounds.push_back(std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / static_cast<double>(n));
  }
  std::sort(rounds.begin(), rounds.end());
  return rounds[3];
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t n = argc > 1 ? std::stoll(argv[1]) : 50000;
  const std::string dir = (std::filesystem::temp_directory_path() / "hetseq-trace-span-cost").string();
  hetseq::TraceOptions options;
  options.dir = dir;
  options.first_update = 2;
  options.last_update = 1'000'000'000;
  double off = 0, outside = 0, recording = 0, added = 0;
  {
    hetseq::Tracer idle(options);  // begin_update(1): outside its window
    idle.begin_update(1);
    hetseq::Tracer on(options);
    on.begin_update(2);
    off = ns_per_span(n, [](int64_t i) { const hetseq::TraceSpan s(nullptr, "forward", i); });
    outside = ns_per_span(n, [&](int64_t i) { const hetseq::TraceSpan s(&idle, "forward", i); });
    recording = ns_per_span(n, [&](int64_t i) { const hetseq::TraceSpan s(&on, "forward", i); });
    const auto now = Clock::now();
    added = ns_per_span(n, [&](int64_t i) { on.add_span("allreduce", hetseq::kBucketTrack, now, now, i, 4096); });
  }  // the tracers write their files here
  std::printf("ns per span: no tracer %.1f, outside the window %.1f, recording %.1f, add_span %.1f\n", off, outside,
              recording, added);
  // (std::filesystem::remove_all resolves to a broken copy exported by libtorch.so; plain calls instead.)
  std::remove((dir + "/trace_rank0.json").c_str());
  ::rmdir(dir.c_str());
  return 0;
}
