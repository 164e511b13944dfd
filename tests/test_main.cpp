// The test binary's entry point. Multi-process tests start hetseq-train and other programs as real
// processes (tests/support/subprocess.h); everything else is plain Catch2.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "hetseq/world/process_group.h"
#include "hetseq/train/precision.h"
#include "support/subprocess.h"
#include "support/zygote_server.h"

namespace {

// Counts the test cases this process runs, for Note [Forked test programs] (support/subprocess.cpp).
struct TestCaseCounter : Catch::TestEventListenerBase {
  using TestEventListenerBase::TestEventListenerBase;
  void testCaseStarting(Catch::TestCaseInfo const& info) override {
    hetseq::test::note_test_case_started();
    TestEventListenerBase::testCaseStarting(info);
  }
};
CATCH_REGISTER_LISTENER(TestCaseCounter)

}  // namespace

int main(int argc, char* argv[]) {
  // `--zygote SOCKET`: the ctest fixture's zygote, which returns only in the test processes it forks, with
  // their command lines (Note [Test zygote], support/zygote_server.cpp).
  std::vector<std::string> zygote_args;
  std::vector<char*> zygote_argv;
  if (argc == 3 && std::string(argv[1]) == "--zygote") {
    auto args = hetseq::test::serve_as_zygote(argv[2]);
    if (!args) return 0;
    zygote_args = std::move(*args);
    for (auto& a : zygote_args) zygote_argv.push_back(a.data());
    zygote_argv.push_back(nullptr);
    argc = static_cast<int>(zygote_args.size());
    argv = zygote_argv.data();
  }
  // Tests run several ranks as threads of one process: Note [Flight recorder off].
  hetseq::flight_recorder_off_by_default();
  // The in-process float16 tests train on the CPU too: Note [Float16 on CPUs with AVX512-FP16].
  hetseq::avoid_slow_cpu_fp16_kernels();
  // What a forked hetseq-train restores: Note [Forked test programs] (support/subprocess.cpp).
  hetseq::test::remember_fresh_process_settings();
  // One intra-op thread: ctest runs two tests at once on a 2-core machine (scripts/test.sh), and two
  // processes of 2 OpenMP threads each on 2 cores spin at every parallel region's barrier while the other
  // process holds the core (an fp16 test took 24 s under ctest, 10 s alone on one thread). Programs the
  // tests start choose their own threads (hetseq-train divides the cores among its workers).
  torch::set_num_threads(1);
  Catch::Session session;
  const int rc = session.applyCommandLine(argc, argv);
  if (rc != 0) return rc;
  // A filter that matches no test (a renamed test, a name ctest split) fails instead of passing.
  session.configData().warnings = static_cast<Catch::WarnAbout::What>(session.configData().warnings |
                                                                        Catch::WarnAbout::NoTests);
  return session.run();
}
