#include "tasks/mnist/mnist_model.h"

#include <torch/nn/functional/activation.h>
#include <torch/nn/functional/pooling.h>

namespace hetseq::mnist {

namespace F = torch::nn::functional;

MnistNetImpl::MnistNetImpl(const MnistNetOptions& options) : options_(options) {
  conv1_ = register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 32, 3).stride(1)));
  conv2_ = register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(32, 64, 3).stride(1)));
  dropout1_ = register_module("dropout1", torch::nn::Dropout2d(options.dropout1));
  dropout2_ = register_module("dropout2", torch::nn::Dropout(options.dropout2));
  fc1_ = register_module("fc1", torch::nn::Linear(9216, options.hidden));
  fc2_ = register_module("fc2", torch::nn::Linear(options.hidden, 10));
}

torch::Tensor MnistNetImpl::forward(const torch::Tensor& images) {
  // Each layer with parameters is a unit (units()), run through the runner under --zero-sharding full.
  torch::Tensor x = torch::relu(run_unit(runner_, 0, [&] { return conv1_->forward(images); }));  // [N, 32, 26, 26]
  x = torch::relu(run_unit(runner_, 1, [&] { return conv2_->forward(x); }));                     // [N, 64, 24, 24]
  x = F::max_pool2d(x, F::MaxPool2dFuncOptions(2));                                              // [N, 64, 12, 12]
  x = dropout1_->forward(x);
  x = torch::flatten(x, 1);                                                     // [N, 9216]
  x = torch::relu(run_unit(runner_, 2, [&] { return fc1_->forward(x); }));      // [N, hidden]
  x = dropout2_->forward(x);
  x = run_unit(runner_, 3, [&] { return fc2_->forward(x); });                   // [N, 10]
  return F::log_softmax(x, F::LogSoftmaxFuncOptions(1));
}

std::vector<std::shared_ptr<torch::nn::Module>> MnistNetImpl::units() {
  return {conv1_.ptr(), conv2_.ptr(), fc1_.ptr(), fc2_.ptr()};
}

}  // namespace hetseq::mnist
