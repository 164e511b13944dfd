// CUDA graphs for the Controller's captured updates: compiled only where LibTorch has CUDA.
#include <ATen/autocast_mode.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/cuda.h>

#include "hetseq/core/format.h"
#include "hetseq/train/graph_capture.h"

namespace hetseq {
namespace {

/// Makes `waiting` wait for the work queued on `done` so far.
void wait_for(const c10::cuda::CUDAStream& waiting, const c10::cuda::CUDAStream& done) {
  at::cuda::CUDAEvent event;
  event.record(done);
  event.block(waiting);
}

class CudaGraphCapture final : public GraphCapture {
 public:
  explicit CudaGraphCapture(c10::DeviceIndex device)
      : device_(device), side_(c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device)) {}

  void warm_up(const std::function<void()>& work) override { on_side(work); }

  void capture(const std::function<void()>& work) override {
    const bool cache = at::autocast::is_autocast_cache_enabled();
    // A cast cached by autocast during capture would live in the graph's memory and be read by later
    // eager code; PyTorch's graph documentation asks for the cache off while capturing.
    at::autocast::set_autocast_cache_enabled(false);
    // The warm-up's blocks go back to the driver first: the graph's private pool and the eager pool are
    // then not both held at their peaks (Note [CUDA-graph updates]).
    c10::cuda::CUDACachingAllocator::emptyCache();
    try {
      on_side([&] {
        // Thread-local mode: the loader's threads keep pinning host memory (cudaHostAlloc) while this thread
        // captures; in the default global mode such a call from any thread breaks the capture.
        graph_.capture_begin(/*pool=*/{0, 0}, cudaStreamCaptureModeThreadLocal);
        try {
          work();
        } catch (...) {
          try {
            graph_.capture_end();
          } catch (...) {
          }
          throw;
        }
        graph_.capture_end();
      });
    } catch (...) {
      at::autocast::set_autocast_cache_enabled(cache);
      throw;
    }
    at::autocast::set_autocast_cache_enabled(cache);
  }

  void replay() override {
    const c10::cuda::CUDAGuard guard(device_);
    graph_.replay();
  }

 private:
  void on_side(const std::function<void()>& work) {
    const c10::cuda::CUDAGuard guard(device_);
    const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(device_);
    wait_for(side_, current);
    {
      const c10::cuda::CUDAStreamGuard on_side(side_);
      work();
    }
    wait_for(current, side_);
  }

  c10::DeviceIndex device_;
  c10::cuda::CUDAStream side_;
  at::cuda::CUDAGraph graph_;
};

}  // namespace

std::unique_ptr<GraphCapture> make_graph_capture(const c10::Device& device, std::string& why) {
  if (!device.is_cuda()) {
    why = fmt::format("the rank trains on {}, and CUDA graphs need a GPU", device.str());
    return nullptr;
  }
  if (!torch::cuda::is_available()) {
    why = "no CUDA device is visible";
    return nullptr;
  }
  return std::make_unique<CudaGraphCapture>(device.has_index() ? device.index() : c10::cuda::current_device());
}

}  // namespace hetseq
