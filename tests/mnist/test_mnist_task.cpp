// The mnist task: built through the task registry from a parsed command line, on small IDX files written
// here and on the installed Fashion-MNIST; its model, batches, loss and metrics.

#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>
#include <cxxopts.hpp>
#include <torch/torch.h>

#include "hetseq/core/error.h"
#include "hetseq/core/format.h"
#include "hetseq/cli/train_options.h"
#include "hetseq/task/task_registry.h"
#include "tasks/mnist/mnist_dataset.h"
#include "tasks/mnist/mnist_model.h"
#include "tasks/mnist/mnist_task.h"
#include "support/error_message.h"
#include "support/temp_dir.h"

namespace fs = std::filesystem;
using Catch::Contains;
using hetseq::mnist::MnistNetImpl;
using hetseq::mnist::MnistTask;

using hetseq::test::TempDir;

using hetseq::test::error_of;

namespace {

constexpr int64_t kSide = 28;
constexpr int64_t kPixels = kSide * kSide;
const char* const kFashionMnist = "/usr/share/datasets/fashion-mnist";


/// Writes an IDX file of unsigned bytes (see Note [IDX format]), gzipped when `path` ends in `.gz`.
void write_idx(const std::string& path, const std::vector<uint32_t>& sizes, const std::vector<uint8_t>& data) {
  std::vector<uint8_t> bytes{0, 0, 0x08, static_cast<uint8_t>(sizes.size())};
  for (const uint32_t s : sizes) {
    for (int shift = 24; shift >= 0; shift -= 8) bytes.push_back(static_cast<uint8_t>(s >> shift));
  }
  bytes.insert(bytes.end(), data.begin(), data.end());
  if (path.size() > 3 && path.compare(path.size() - 3, 3, ".gz") == 0) {
    gzFile file = gzopen(path.c_str(), "wb");
    REQUIRE(file != nullptr);
    REQUIRE(gzwrite(file, bytes.data(), static_cast<unsigned>(bytes.size())) == int(bytes.size()));
    REQUIRE(gzclose(file) == Z_OK);
  } else {
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    REQUIRE(out.good());
  }
}

/// Pixel j of synthetic image k of a split whose pixels are (k * a + j * b) mod 256.
uint8_t synthetic_pixel(int64_t k, int64_t j, int64_t a, int64_t b) { return static_cast<uint8_t>((k * a + j * b) % 256); }

std::vector<uint8_t> synthetic_images(int64_t count, int64_t a, int64_t b) {
  std::vector<uint8_t> out;
  for (int64_t k = 0; k < count; ++k) {
    for (int64_t j = 0; j < kPixels; ++j) out.push_back(synthetic_pixel(k, j, a, b));
  }
  return out;
}

/// A data directory with a synthetic train split (6 images, labels 0..5, gzipped) and test split (4 images,
/// labels 9, 8, 7, 6, plain files).
struct SyntheticData {
  TempDir dir;
  SyntheticData() {
    write_idx(dir.file("train-images-idx3-ubyte.gz"), {6, kSide, kSide}, synthetic_images(6, 31, 7));
    write_idx(dir.file("train-labels-idx1-ubyte.gz"), {6}, {0, 1, 2, 3, 4, 5});
    write_idx(dir.file("t10k-images-idx3-ubyte"), {4, kSide, kSide}, synthetic_images(4, 13, 3));
    write_idx(dir.file("t10k-labels-idx1-ubyte"), {4}, {9, 8, 7, 6});
  }
};

/// Parses `args` the way the driver does: the general --data flag plus the mnist task's own flags.
/// The flag values of an `hetseq-train` command line with `args`: --data and every task's flags.
hetseq::FlagValues parse_command_line(std::vector<std::string> args) {
  const hetseq::TaskSpec& spec = hetseq::TaskRegistry::global().get("mnist");
  cxxopts::Options options("hetseq-train", "mnist task test");
  options.add_options()("data", "data directory", cxxopts::value<std::string>()->default_value(spec.defaults.at("data")));
  hetseq::cli::add_task_flags(options);
  args.insert(args.begin(), "hetseq-train");
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  return hetseq::cli::flag_values(options.parse(static_cast<int>(argv.size()), argv.data()));
}

/// Builds the mnist task through the registry from command-line arguments.
std::unique_ptr<hetseq::Task> make_task(const std::vector<std::string>& args) {
  return hetseq::TaskRegistry::global().get("mnist").create(parse_command_line(args), hetseq::TaskContext{});
}

MnistTask& as_mnist(hetseq::Task& task) {
  auto* mnist = dynamic_cast<MnistTask*>(&task);
  REQUIRE(mnist != nullptr);
  return *mnist;
}

std::vector<int64_t> iota(int64_t n) {
  std::vector<int64_t> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out[static_cast<size_t>(i)] = i;
  return out;
}

}  // namespace

TEST_CASE("the mnist task is registered with its flags and defaults", "[mnist][task]") {
  auto& registry = hetseq::TaskRegistry::global();
  REQUIRE(registry.contains("mnist"));
  const hetseq::TaskSpec& spec = registry.get("mnist");
  CHECK(spec.name == "mnist");
  CHECK_FALSE(spec.description.empty());
  CHECK(spec.defaults.at("valid-subset") == "test");
  CHECK(spec.defaults.at("data") == kFashionMnist);

  cxxopts::Options options("hetseq-train");
  hetseq::cli::add_task_flags(options);
  const auto groups = options.groups();
  CHECK(std::find(groups.begin(), groups.end(), "MNIST task") != groups.end());
  CHECK_THAT(options.help({"MNIST task"}), Contains("--dropout"));
}

TEST_CASE("mnist: --dropout is parsed strictly", "[mnist][task]") {
  SyntheticData data;
  const std::string data_flag = "--data=" + data.dir.path();

  SECTION("the default is 0.25,0.5") {
    auto task = make_task({data_flag});
    const auto model = std::dynamic_pointer_cast<MnistNetImpl>(task->build_model());
    REQUIRE(model != nullptr);
    CHECK(model->options().dropout1 == 0.25);
    CHECK(model->options().dropout2 == 0.5);
  }
  SECTION("a bracketed list with spaces is accepted") {
    auto task = make_task({data_flag, "--dropout", "(0.1, 0)"});
    CHECK(as_mnist(*task).options().model.dropout1 == 0.1);
    CHECK(as_mnist(*task).options().model.dropout2 == 0.0);
  }
  SECTION("anything but two probabilities in [0, 1) is a UsageError naming --dropout") {
    for (const std::string bad : {"0.5", "0.1,0.2,0.3", "1,0.5", "0.5,1.0", "-0.1,0.5", "abc", "0.25;0.5", "0.25,",
                                  "nan,0.5", "0.25,0.5x"}) {
      CAPTURE(bad);
      CHECK_THAT(error_of<hetseq::UsageError>([&] { make_task({data_flag, "--dropout=" + bad}); }),
                 Contains("--dropout"));
    }
  }
}

TEST_CASE("mnist: --data must name an existing directory", "[mnist][task]") {
  TempDir dir;
  const std::string missing = dir.file("no-such-dir");
  CHECK_THAT(error_of<hetseq::InputError>([&] { make_task({"--data", missing}); }),
             Contains("--data") && Contains(missing) && Contains("no such directory"));

  const std::string file = dir.file("a-file");
  std::ofstream(file) << "x";
  CHECK_THAT(error_of<hetseq::InputError>([&] { make_task({"--data", file}); }),
             Contains("--data") && Contains(file) && Contains("not a directory"));

  CHECK_THAT(error_of<hetseq::UsageError>([&] { make_task({"--data="}); }), Contains("--data"));
}

TEST_CASE("the mnist task loads the train and test splits of a data directory", "[mnist][task]") {
  SyntheticData data;
  auto task = make_task({"--data", data.dir.path()});

  const auto train = task->load_dataset("train");
  const auto test = task->load_dataset("test");
  CHECK(train->size() == 6);
  CHECK(test->size() == 4);
  CHECK(torch::equal(test->collate(iota(4)).at("target"), torch::tensor({9, 8, 7, 6}, torch::kInt64)));

  SECTION("an unknown split is a UsageError listing the splits") {
    CHECK_THAT(error_of<hetseq::UsageError>([&] { task->load_dataset("valid"); }),
               Contains("'valid'") && Contains("train, test"));
  }
  SECTION("a split whose files are missing is an InputError naming --data and the file") {
    REQUIRE(std::remove(data.dir.file("t10k-labels-idx1-ubyte").c_str()) == 0);
    CHECK_THAT(error_of<hetseq::InputError>([&] { task->load_dataset("test"); }),
               Contains("--data " + data.dir.path()) && Contains("t10k-labels-idx1-ubyte") && Contains("'test'"));
  }
}

TEST_CASE("a split with bad images or labels is an InputError naming the file", "[mnist][task]") {
  TempDir dir;
  auto task = make_task({"--data", dir.path()});
  const std::string images = dir.file("train-images-idx3-ubyte");
  const std::string labels = dir.file("train-labels-idx1-ubyte");

  SECTION("images that are not 28x28") {
    write_idx(images, {2, 27, 28}, std::vector<uint8_t>(2 * 27 * 28, 1));
    write_idx(labels, {2}, {0, 1});
    CHECK_THAT(error_of<hetseq::InputError>([&] { task->load_dataset("train"); }),
               Contains(images) && Contains("27x28"));
  }
  SECTION("a label outside 0..9") {
    write_idx(images, {2, kSide, kSide}, synthetic_images(2, 1, 1));
    write_idx(labels, {2}, {0, 10});
    CHECK_THAT(error_of<hetseq::InputError>([&] { task->load_dataset("train"); }),
               Contains(labels) && Contains("0..10"));
  }
  SECTION("different numbers of images and labels") {
    write_idx(images, {2, kSide, kSide}, synthetic_images(2, 1, 1));
    write_idx(labels, {3}, {0, 1, 2});
    CHECK_THAT(error_of<hetseq::InputError>([&] { task->load_dataset("train"); }),
               Contains(images) && Contains(labels));
  }
}

TEST_CASE("batches are normalised with the train split's exact pixel statistics", "[mnist][task]") {
  SyntheticData data;
  auto task = make_task({"--data", data.dir.path()});
  // Load the test split first: the statistics still come from the train images.
  const auto test = task->load_dataset("test");
  const auto train = task->load_dataset("train");

  double sum = 0;
  double sum_squares = 0;
  for (int64_t k = 0; k < 6; ++k) {
    for (int64_t j = 0; j < kPixels; ++j) {
      const double x = synthetic_pixel(k, j, 31, 7) / 255.0;
      sum += x;
      sum_squares += x * x;
    }
  }
  const double mean = sum / (6 * kPixels);
  const double std = std::sqrt(sum_squares / (6 * kPixels) - mean * mean);
  const hetseq::mnist::PixelStats stats = as_mnist(*task).pixel_stats();
  CHECK(stats.mean == Approx(mean).epsilon(1e-12));
  CHECK(stats.std == Approx(std).epsilon(1e-12));

  const hetseq::Batch batch = test->collate({3, 1});
  CHECK(batch.num_samples == 2);
  const torch::Tensor input = batch.at("input");
  REQUIRE(input.scalar_type() == torch::kFloat32);
  REQUIRE(input.sizes() == torch::IntArrayRef({2, 1, kSide, kSide}));
  CHECK(torch::equal(batch.at("target"), torch::tensor({6, 8}, torch::kInt64)));
  for (const auto& [row, k] : {std::pair<int64_t, int64_t>{0, 3}, {1, 1}}) {
    for (const int64_t j : {int64_t{0}, int64_t{1}, int64_t{400}, kPixels - 1}) {
      const double expected = (synthetic_pixel(k, j, 13, 3) / 255.0 - mean) / std;
      CHECK(input[row][0][j / kSide][j % kSide].item<double>() == Approx(expected).margin(1e-5));
    }
  }

  const torch::Tensor all_train = train->collate(iota(6)).at("input").to(torch::kDouble);
  CHECK(all_train.mean().item<double>() == Approx(0).margin(1e-5));
  CHECK(all_train.std(/*unbiased=*/false).item<double>() == Approx(1).margin(1e-5));
}

TEST_CASE("collate gives empty tensors for no indices, rejects bad indices, and is thread-safe", "[mnist][task]") {
  SyntheticData data;
  auto task = make_task({"--data", data.dir.path()});
  const auto train = task->load_dataset("train");

  const hetseq::Batch empty = train->collate({});
  CHECK(empty.empty());
  CHECK(empty.at("input").sizes() == torch::IntArrayRef({0, 1, kSide, kSide}));
  CHECK(empty.at("input").scalar_type() == torch::kFloat32);
  CHECK(empty.at("target").sizes() == torch::IntArrayRef({0}));
  CHECK(empty.at("target").scalar_type() == torch::kInt64);

  CHECK_THROWS_AS(train->collate({0, 6}), hetseq::InternalError);
  CHECK_THROWS_AS(train->collate({-1}), hetseq::InternalError);

  const std::vector<int64_t> order{5, 0, 3, 3, 1};
  const hetseq::Batch reference = train->collate(order);
  std::vector<hetseq::Batch> results(4);
  std::vector<std::thread> threads;
  for (size_t t = 0; t < results.size(); ++t) {
    threads.emplace_back([&, t] {
      for (int repeat = 0; repeat < 20; ++repeat) results[t] = train->collate(order);
    });
  }
  for (auto& thread : threads) thread.join();
  for (const auto& result : results) {
    CHECK(torch::equal(result.at("input"), reference.at("input")));
    CHECK(torch::equal(result.at("target"), reference.at("target")));
  }
}

TEST_CASE("MnistNet maps [N, 1, 28, 28] images to log-probabilities [N, 10]", "[mnist][model]") {
  torch::manual_seed(3);
  hetseq::mnist::MnistNet net(hetseq::mnist::MnistNetOptions{0.1, 0.2});
  CHECK(net->options().dropout1 == 0.1);
  CHECK(net->options().dropout2 == 0.2);

  int64_t parameters = 0;
  for (const auto& p : net->parameters()) parameters += p.numel();
  CHECK(parameters == 320 + 18496 + 1179776 + 1290);  // as HetSeq's MNISTNet
  const auto named = net->named_parameters();
  for (const char* name : {"conv1.weight", "conv2.bias", "fc1.weight", "fc2.bias"}) CHECK(named.contains(name));

  const torch::Tensor images = torch::randn({5, 1, kSide, kSide});
  for (const bool training : {true, false}) {
    CAPTURE(training);
    net->train(training);
    const torch::Tensor log_probs = net->forward(images);
    CHECK(log_probs.sizes() == torch::IntArrayRef({5, 10}));
    CHECK(torch::allclose(log_probs.exp().sum(1), torch::ones({5}), 1e-5, 1e-5));
  }
}

TEST_CASE("the mnist loss is the summed NLL, with ncorrect and accuracy", "[mnist][task]") {
  SyntheticData data;
  torch::manual_seed(11);
  auto task = make_task({"--data", data.dir.path()});
  const auto train = task->load_dataset("train");
  const auto model = task->build_model();
  model->eval();  // no dropout, so two forward passes agree
  auto& net = dynamic_cast<MnistNetImpl&>(*model);

  const hetseq::Batch batch = train->collate({4, 2, 0, 5, 1});
  const hetseq::StepOutput out = task->compute_loss(*model, batch);

  const torch::Tensor log_probs = net.forward(batch.at("input"));
  const torch::Tensor target = batch.at("target");
  double expected_loss = 0;
  int64_t expected_correct = 0;
  for (int64_t i = 0; i < 5; ++i) {
    const int64_t t = target[i].item<int64_t>();
    expected_loss -= log_probs[i][t].item<double>();
    int64_t best = 0;
    for (int64_t c = 1; c < 10; ++c) {
      if (log_probs[i][c].item<double>() > log_probs[i][best].item<double>()) best = c;
    }
    expected_correct += best == t;
  }

  CHECK(out.loss.dim() == 0);
  CHECK(out.loss.requires_grad());
  CHECK(out.loss.item<double>() == Approx(expected_loss).epsilon(1e-5));
  CHECK(out.sample_size == 5);
  // The correct count stays on the device until read (Note [Statistics on the device]); the loss, nll_loss,
  // nsentences and ntokens are the library's defaults (the loss, and sample_size).
  CHECK(out.log.empty());
  CHECK(out.log_tensors.size() == 1);
  const hetseq::LogSums log = hetseq::host_log(out);
  CHECK(log.size() == 3);
  CHECK(log.at("loss") == Approx(expected_loss).epsilon(1e-5));
  CHECK(log.at("loss") == out.loss.item<double>());
  CHECK(log.at("ncorrect") == expected_correct);
  const hetseq::MetricSums sums(log);
  CHECK(sums[hetseq::metrics::kNllLoss] == log.at("loss"));
  CHECK(sums[hetseq::metrics::kNsentences] == 5);
  CHECK(sums[hetseq::mnist::kCorrect] == expected_correct);
  CHECK(task->derived_metrics(log).at("accuracy") == Approx(100.0 * expected_correct / 5));

  const auto metrics = task->derived_metrics(hetseq::LogSums{{"ncorrect", 3}, {"nsentences", 4}, {"sample_size", 5}});
  CHECK(metrics.at("accuracy") == Approx(75.0));
  CHECK(task->derived_metrics(hetseq::LogSums{{"ncorrect", 0}, {"nsentences", 0}}).count("accuracy") == 0);

  // train_step: backward of the summed loss reaches every parameter.
  model->train();
  model->zero_grad();
  task->train_step(*model, batch);
  for (const auto& p : model->parameters()) {
    REQUIRE(p.grad().defined());
  }
  CHECK(model->named_parameters()["fc2.bias"].grad().abs().sum().item<double>() > 0);
}

TEST_CASE("the installed Fashion-MNIST loads as 60000 train and 10000 test samples, normalised", "[mnist][task][installed-data]") {
  auto task = make_task({});  // --data defaults to the installed Fashion-MNIST
  CHECK(as_mnist(*task).options().data_dir == kFashionMnist);
  const auto train = task->load_dataset("train");
  const auto test = task->load_dataset("test");
  CHECK(train->size() == 60000);
  CHECK(test->size() == 10000);

  // Fashion-MNIST's published pixel statistics.
  const hetseq::mnist::PixelStats stats = as_mnist(*task).pixel_stats();
  CHECK(stats.mean == Approx(0.2860).margin(1e-3));
  CHECK(stats.std == Approx(0.3530).margin(1e-3));

  std::mt19937 generator(7);
  std::uniform_int_distribution<int64_t> pick(0, train->size() - 1);
  std::vector<int64_t> sample(2000);
  for (auto& i : sample) i = pick(generator);
  const hetseq::Batch batch = train->collate(sample);
  CHECK(batch.num_samples == 2000);
  CHECK(batch.at("input").sizes() == torch::IntArrayRef({2000, 1, kSide, kSide}));
  const torch::Tensor input = batch.at("input").to(torch::kDouble);
  CHECK(input.mean().item<double>() == Approx(0).margin(0.05));
  CHECK(input.std().item<double>() == Approx(1).margin(0.05));
  CHECK(batch.at("target").min().item<int64_t>() >= 0);
  CHECK(batch.at("target").max().item<int64_t>() <= 9);

  // A fresh task that loads only the test split normalises it with the same statistics.
  auto test_only = make_task({});
  test_only->load_dataset("test");
  CHECK(as_mnist(*test_only).pixel_stats().mean == stats.mean);
  CHECK(as_mnist(*test_only).pixel_stats().std == stats.std);
}
