#include "hetseq/train/graph_capture.h"

namespace hetseq {

#ifndef HETSEQ_WITH_CUDA
// A LibTorch without CUDA; the CUDA build defines this in train/cuda/cuda_graph_capture.cpp.
std::unique_ptr<GraphCapture> make_graph_capture(const c10::Device& device, std::string& why) {
  why = "this build of hetseq has no CUDA (its LibTorch was built without it)";
  return nullptr;
}
#endif

}  // namespace hetseq
