#pragma once
// A GraphCapture double for CPU tests of the Controller's captured updates (Note [CUDA-graph updates]): it records
// its calls, can fail its capture as a device can, and replays by running the captured work again.

#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "hetseq/train/graph_capture.h"

namespace hetseq::test {

/// What a RecordingGraphCapture saw; the test keeps it, the Controller owns the double.
struct CaptureRecord {
  /// How the capture fails: not, in the work (as an operation a capture refuses), at the end once the work was
  /// recorded (as cudaStreamEndCapture reports an invalidated capture), or with a throw of no std::exception.
  enum class Failure { kNone, kInWork, kAtEnd, kNotStd };
  Failure failure = Failure::kNone;
  std::vector<std::string> calls;  // [call] "warm_up", "capture", "replay", in order
  /// The host values a replay depends on, described by the test (the coming batch's sample count, the gradients'
  /// addresses, ...): taken when the capture succeeds and again at every replay.
  std::function<std::string()> host_values;
  std::string captured_values;      // host_values() at the capture
  std::vector<std::string> stale;   // [replay that saw other values] what it saw
  /// Called at every replay before the work runs again (a test's look at what the Controller prepared).
  std::function<void()> on_replay;
  /// The tensors whose values a capture leaves as they were (on a device it records kernels and runs none; here
  /// the work runs): the double puts them back after running the capture's work. The parameters and the
  /// optimizer's state, where the graph holds the step.
  std::function<std::vector<torch::Tensor>()> untouched;
  int64_t count(const std::string& call) const {
    int64_t n = 0;
    for (const auto& c : calls) n += c == call;
    return n;
  }
};

class RecordingGraphCapture final : public GraphCapture {
 public:
  explicit RecordingGraphCapture(std::shared_ptr<CaptureRecord> record) : record_(std::move(record)) {}

  void warm_up(const std::function<void()>& work) override {
    record_->calls.push_back("warm_up");
    work();
  }

  void capture(const std::function<void()>& work) override {
    record_->calls.push_back("capture");
    using Failure = CaptureRecord::Failure;
    if (record_->failure == Failure::kInWork) throw std::runtime_error("operation not permitted when stream is capturing");
    if (record_->failure == Failure::kNotStd) throw 900;
    std::vector<torch::Tensor> kept, saved;  // [tensor] what the work must not change, and its values before
    if (record_->untouched) {
      kept = record_->untouched();
      for (const auto& t : kept) saved.push_back(t.detach().clone());
    }
    work();  // on the CPU the kernels run as they are recorded
    {
      torch::NoGradGuard no_grad;
      for (size_t i = 0; i < kept.size(); ++i) kept[i].copy_(saved[i]);
    }
    if (record_->failure == Failure::kAtEnd) throw std::runtime_error("capture_end: the capture was invalidated");
    work_ = work;
    if (record_->host_values) record_->captured_values = record_->host_values();
  }

  void replay() override {
    record_->calls.push_back("replay");
    if (record_->host_values) {
      const std::string now = record_->host_values();
      if (now != record_->captured_values) record_->stale.push_back(now);
    }
    if (record_->on_replay) record_->on_replay();
    work_();
  }

 private:
  std::shared_ptr<CaptureRecord> record_;
  std::function<void()> work_;
};

/// A ControllerOptions::graph_capture that hands the Controller a RecordingGraphCapture writing into `record`.
inline GraphCaptureFactory recording_graph_capture(std::shared_ptr<CaptureRecord> record) {
  return [record](const c10::Device&, std::string&) { return std::make_unique<RecordingGraphCapture>(record); };
}

}  // namespace hetseq::test
