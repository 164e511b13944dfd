// apply_to_process: what CommonOptions sets for the whole process (intra-op threads, --deterministic; Note
// [Deterministic GPU kernels]). Read back from LibTorch's global context, then put back as it was.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <string>

#include <ATen/Context.h>
#include <torch/torch.h>

#include "hetseq/session/session_options.h"

TEST_CASE("apply_to_process: --deterministic turns cuDNN's deterministic mode on, its benchmark mode off, and fixes cuBLAS's workspace",
          "[session][parse]") {
  auto& context = at::globalContext();
  const bool was_deterministic = context.deterministicCuDNN(), was_benchmark = context.benchmarkCuDNN();
  const int threads = torch::get_num_threads();
  const char* env = std::getenv("CUBLAS_WORKSPACE_CONFIG");
  const std::string previous_env = env ? env : "";
  ::unsetenv("CUBLAS_WORKSPACE_CONFIG");
  context.setBenchmarkCuDNN(true);
  context.setDeterministicCuDNN(false);

  hetseq::CommonOptions common;
  common.intra_op_threads = 1;
  SECTION("off by default: nothing but the threads changes") {
    hetseq::apply_to_process(common);
    CHECK(torch::get_num_threads() == 1);
    CHECK(!context.deterministicCuDNN());
    CHECK(context.benchmarkCuDNN());
    CHECK(std::getenv("CUBLAS_WORKSPACE_CONFIG") == nullptr);
  }
  SECTION("on") {
    common.deterministic = true;
    hetseq::apply_to_process(common);
    CHECK(context.deterministicCuDNN());
    CHECK(!context.benchmarkCuDNN());
    REQUIRE(std::getenv("CUBLAS_WORKSPACE_CONFIG") != nullptr);
    CHECK(std::string(std::getenv("CUBLAS_WORKSPACE_CONFIG")) == ":4096:8");
  }
  SECTION("on, with the user's own cuBLAS workspace setting kept") {
    ::setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8", 1);
    common.deterministic = true;
    hetseq::apply_to_process(common);
    CHECK(std::string(std::getenv("CUBLAS_WORKSPACE_CONFIG")) == ":16:8");
  }

  context.setDeterministicCuDNN(was_deterministic);
  context.setBenchmarkCuDNN(was_benchmark);
  torch::set_num_threads(threads);
  if (previous_env.empty()) {
    ::unsetenv("CUBLAS_WORKSPACE_CONFIG");
  } else {
    ::setenv("CUBLAS_WORKSPACE_CONFIG", previous_env.c_str(), 1);
  }
}
