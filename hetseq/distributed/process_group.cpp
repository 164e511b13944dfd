#include "hetseq/distributed/process_group.h"

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#ifdef HETSEQ_WITH_CUDA
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#include <torch/cuda.h>
#endif

#include "hetseq/core/error.h"

namespace hetseq {

c10::intrusive_ptr<c10d::ProcessGroup> make_process_group(const c10::intrusive_ptr<c10d::Store>& store, int64_t rank,
                                                          int64_t world_size, const ProcessGroupOptions& options) {
  auto group = c10::make_intrusive<c10d::ProcessGroup>(store, static_cast<int>(rank), static_cast<int>(world_size));
  try {
    if (options.backend == "gloo") {
      auto gloo_options = c10d::ProcessGroupGloo::Options::create();
      gloo_options->timeout = options.timeout;
      gloo_options->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
      auto backend = c10::make_intrusive<c10d::ProcessGroupGloo>(store, static_cast<int>(rank),
                                                                  static_cast<int>(world_size), gloo_options);
      group->setDefaultBackend(c10d::ProcessGroup::BackendType::GLOO);
      group->setBackend(c10::DeviceType::CPU, c10d::ProcessGroup::BackendType::GLOO, backend);
      return group;
    }
    if (options.backend == "nccl") {
#ifdef HETSEQ_WITH_CUDA
      if (!torch::cuda::is_available()) {
        throw UsageError("--distributed-backend nccl needs CUDA devices, and none is visible; use gloo (or --cpu)");
      }
      auto nccl_options = c10d::ProcessGroupNCCL::Options::create();
      nccl_options->timeout = options.timeout;
      auto backend = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, static_cast<int>(rank),
                                                                  static_cast<int>(world_size), nccl_options);
      group->setDefaultBackend(c10d::ProcessGroup::BackendType::NCCL);
      group->setBackend(c10::DeviceType::CUDA, c10d::ProcessGroup::BackendType::NCCL, backend);
      return group;
#else
      throw UsageError("--distributed-backend nccl: this build's LibTorch has no CUDA; use gloo");
#endif
    }
  } catch (const c10::Error& e) {
    throw InputError(fmt::format("rank {}: the {} process group of {} ranks failed to connect: {}", rank,
                                 options.backend, world_size, e.what_without_backtrace()));
  }
  throw UsageError(fmt::format("--distributed-backend: '{}' is not one of gloo, nccl", options.backend));
}

}  // namespace hetseq
