#include "tasks/mnist/mnist_task.h"

#include <filesystem>
#include <utility>

#include <torch/nn/functional/loss.h>

#include "hetseq/core/error.h"
#include "hetseq/core/format.h"
#include "hetseq/core/logging.h"
#include "hetseq/core/parse.h"
#include "hetseq/task/task_registry.h"
#include "tasks/mnist/idx_reader.h"

namespace hetseq::mnist {
namespace {

namespace fs = std::filesystem;

/// The file name prefix of a split (`train`, `t10k`); throws hetseq::UsageError for an unknown split.
std::string split_prefix(const std::string& split) {
  if (split == "train") return "train";
  if (split == "test") return "t10k";
  throw UsageError(fmt::format("mnist task: unknown split '{}'; available splits: {}", split,
                               fmt::join(mnist_split_names(), ", ")));
}

/// `<data_dir>/<base>` or `<data_dir>/<base>.gz`, whichever exists (the plain file first).
std::string find_idx_file(const std::string& data_dir, const std::string& split, const std::string& base) {
  for (const std::string& name : {base, base + ".gz"}) {
    const fs::path path = fs::path(data_dir) / name;
    std::error_code ec;
    if (fs::exists(path, ec)) return path.string();
  }
  throw InputError(fmt::format("--data {}: no {} or {}.gz for split '{}'; download MNIST or Fashion-MNIST into this "
                               "directory or point --data at one that has them",
                               data_dir, base, base, split));
}

}  // namespace

MnistNetOptions parse_dropout(const std::string& text) {
  const std::vector<double> values = parse_double_list("--dropout", text);
  if (values.size() != 2) {
    throw UsageError(fmt::format("--dropout: '{}' has {} value(s); give two dropout probabilities, for the "
                                 "convolutional features and the hidden layer, e.g. '0.25,0.5'",
                                 text, values.size()));
  }
  for (const double p : values) {
    if (!(p >= 0.0 && p < 1.0)) {
      throw UsageError(fmt::format("--dropout: {} in '{}' is not a probability in [0, 1)", p, text));
    }
  }
  return MnistNetOptions{values[0], values[1]};
}

const std::vector<std::string>& mnist_split_names() {
  static const std::vector<std::string> names{"train", "test"};
  return names;
}

MnistFiles find_split_files(const std::string& data_dir, const std::string& split) {
  const std::string prefix = split_prefix(split);
  return MnistFiles{find_idx_file(data_dir, split, prefix + "-images-idx3-ubyte"),
                    find_idx_file(data_dir, split, prefix + "-labels-idx1-ubyte")};
}

MnistTask::MnistTask(MnistTaskOptions options) : options_(std::move(options)) {
  const std::string& dir = options_.data_dir;
  if (dir.empty()) {
    throw UsageError("--data: the mnist task needs the directory with the MNIST or Fashion-MNIST IDX files "
                     "(e.g. /usr/share/datasets/fashion-mnist)");
  }
  std::error_code ec;
  const auto status = fs::status(dir, ec);
  if (!fs::exists(status)) {
    throw InputError(fmt::format("--data {}: no such directory; point --data at the directory with the MNIST or "
                                 "Fashion-MNIST IDX files",
                                 dir));
  }
  if (!fs::is_directory(status)) {
    throw InputError(fmt::format("--data {}: not a directory; point --data at the directory that holds "
                                 "train-images-idx3-ubyte[.gz] and the other IDX files",
                                 dir));
  }
}

std::shared_ptr<torch::nn::Module> MnistTask::build_model() {
  return MnistNet(options_.model).ptr();
}

std::shared_ptr<Dataset> MnistTask::load_dataset(const std::string& split) {
  const MnistFiles files = find_split_files(options_.data_dir, split);
  MnistSplit data = read_mnist_split(files);
  PixelStats stats;
  if (split == "train") {
    std::lock_guard<std::mutex> lock(stats_mutex_);
    if (!stats_) stats_ = compute_pixel_stats(data.images);
    stats = *stats_;
  } else {
    stats = pixel_stats();
  }
  const int64_t n = data.images.size(0);
  hetseq::log::info("[mnist] split '{}': {} samples from {} and {} (pixel mean {:.4f}, std {:.4f})", split, n,
                    files.images, files.labels, stats.mean, stats.std);
  return std::make_shared<MnistDataset>(std::move(data), stats);
}

PixelStats MnistTask::pixel_stats() {
  std::lock_guard<std::mutex> lock(stats_mutex_);
  if (!stats_) {
    const MnistFiles train = find_split_files(options_.data_dir, "train");
    stats_ = compute_pixel_stats(read_idx_images(train.images));
  }
  return *stats_;
}

StepOutput MnistTask::compute_loss(torch::nn::Module& model, const Batch& batch) {
  auto* net = dynamic_cast<MnistNetImpl*>(&model);
  HETSEQ_ASSERT(net != nullptr, "the mnist task got a model that is not an MnistNet ({})", model.name());
  StepOutput out;
  out.sample_size = static_cast<double>(batch.num_samples);  // nsentences and ntokens default to it

  const torch::Tensor& target = batch.at("target");
  const torch::Tensor log_probs = net->forward(batch.at("input"));  // [n, 10]
  out.loss = torch::nn::functional::nll_loss(
      log_probs, target, torch::nn::functional::NLLLossFuncOptions().reduction(torch::kSum));
  // On the device, read once per update (Note [Statistics on the device]); `loss` and `nll_loss` are the
  // loss itself, the library's default.
  out.add(kCorrect, log_probs.detach().argmax(1).eq(target).sum());
  return out;
}

std::vector<Ratio> MnistTask::ratios() const { return {{"accuracy", kCorrect, metrics::kNsentences, 100}}; }

namespace {

TaskSpec make_mnist_spec() {
  TaskSpec spec;
  spec.name = "mnist";
  spec.description = "image classification on MNIST or Fashion-MNIST IDX files (HetSeq's MNISTNet)";
  spec.flag_group = "MNIST task";
  spec.flags = [](FlagSet& flags) {
    flags.add("dropout", "dropout probabilities after the convolutions (whole channels) and after the hidden layer",
              "0.25,0.5", "P1,P2")
        .add("hidden-units", "width of the hidden fully connected layer", "128", "N");
  };
  // HetSeq's MNIST recipe (Adadelta, lr 1.01, clip-norm 100): trains out of the box; flags given win.
  spec.defaults = {{"valid-subset", "test"}, {"data", "/usr/share/datasets/fashion-mnist"},
                   {"optimizer", "adadelta"}, {"lr", "1.01"}, {"clip-norm", "100"}};
  spec.create = [](const FlagValues& args, const TaskContext& /*context*/) -> std::unique_ptr<Task> {
    MnistTaskOptions options;
    options.data_dir = args.text("data");
    options.model = parse_dropout(args.text("dropout"));
    options.model.hidden = args.integer("hidden-units");
    if (options.model.hidden < 1) throw UsageError("--hidden-units must be a positive number of units");
    return std::make_unique<MnistTask>(std::move(options));
  };
  return spec;
}

}  // namespace

HETSEQ_REGISTER_TASK(mnist, make_mnist_spec);

}  // namespace hetseq::mnist
