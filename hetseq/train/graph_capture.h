#pragma once

#include <functional>
#include <memory>
#include <string>

#include <c10/core/Device.h>

namespace hetseq {

/// Records a stretch of device work once into a CUDA graph and replays it, for the Controller's captured
/// updates (Note [CUDA-graph updates], train/controller.cpp). Work is warmed up and captured on a side stream
/// that waits for the current stream and that the current stream then waits for; replays run on the current
/// stream.
class GraphCapture {
 public:
  virtual ~GraphCapture() = default;
  /// Runs `work` eagerly on the capture stream: the lazy set-up of libraries (cuBLAS's handle and workspace
  /// for that stream, cuDNN's plans) must happen before a capture, not inside it.
  virtual void warm_up(const std::function<void()>& work) = 0;
  /// Records `work` (its kernels are captured, not run), with autocast's cast cache off. Throws what the
  /// capture throws (an operation that is not allowed while capturing: a host sync, a pageable copy).
  virtual void capture(const std::function<void()>& work) = 0;
  /// Runs the recorded work on the current stream.
  virtual void replay() = 0;
};

/// A capture on `device`; null where there can be none, with the reason in `why` (a CPU device, a LibTorch
/// built without CUDA).
std::unique_ptr<GraphCapture> make_graph_capture(const c10::Device& device, std::string& why);

/// Makes the capture of a Controller's updates on a device, as make_graph_capture does (null, with the reason in
/// `why`, where there can be none). ControllerOptions::graph_capture: tests hand the Controller a double that
/// records its calls, so that its states run on a CPU (tests/train/test_graph_states.cpp).
using GraphCaptureFactory = std::function<std::unique_ptr<GraphCapture>(const c10::Device& device, std::string& why)>;

}  // namespace hetseq
