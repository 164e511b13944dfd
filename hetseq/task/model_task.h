#pragma once
/// ModelTask<Model>: a Task whose model has a known type, so that a task's loss takes its own model
/// class and never casts.

#include <memory>
#include <typeinfo>

#include "hetseq/core/error.h"
#include "hetseq/task/task.h"

namespace hetseq {

/// A Task whose model is a `Model` (a class derived from torch::nn::Module: `torch::nn::SequentialImpl`,
/// or a `struct NetImpl : torch::nn::Module` of one's own). A task implements make_model, load_dataset
/// and loss; the optimizer, the learning-rate schedule and the logged `loss` have defaults (the flags;
/// logged_tensors). See docs/API.md for the smallest complete task.
template <typename Model>
class ModelTask : public Task {
 public:
  /// A freshly initialised model (on the CPU; the Controller moves it to the device). Initialise it from
  /// torch's global generator: the driver seeds it with --seed, the same on every rank.
  virtual std::shared_ptr<Model> make_model() = 0;

  /// The loss of `batch` (never empty, already on the device) summed over its samples, with
  /// `sample_size` the count it sums over (see StepOutput). Must not call backward.
  virtual StepOutput loss(Model& model, const Batch& batch) = 0;

  std::shared_ptr<torch::nn::Module> build_model() final { return make_model(); }

  StepOutput compute_loss(torch::nn::Module& model, const Batch& batch) final {
    auto* typed = dynamic_cast<Model*>(&model);
    HETSEQ_ASSERT(typed != nullptr, "a {} task got a model of another class ({}), not the one make_model built",
                  typeid(Model).name(), model.name());
    return loss(*typed, batch);
  }
};

}  // namespace hetseq
