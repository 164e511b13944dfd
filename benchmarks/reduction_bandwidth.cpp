// One rank of the gradient-reduction bandwidth benchmark (benchmarks/reduction_bandwidth.sh starts the
// ranks). Compares hetseq's gradient reduction (DistributedReducer: c10d::Reducer buckets, allreduces
// started from the backward pass) with one raw allreduce of a flat buffer of the same size, over Gloo.
//
//   reduction-bandwidth --world-size W --rank R --store-file PATH [--model mnist | --numel N]
//                       [--iters K] [--bucket-cap-mb B] [--master-host HOST] [--secret-file PATH]
//
// The gradient side times a backward pass whose compute is negligible (loss = sum of all parameters,
// so every gradient is a tensor of ones) from its start to its return, which the Reducer delays until
// every bucket is reduced; the raw side times pg->allreduce({flat})->wait(). Ranks meet at a barrier
// before each timed step. Rank 0 prints one JSON line per side with the median time and
//   algbw = bytes / time,   busbw = algbw * 2 (W - 1) / W
// (the bus bandwidth of a ring allreduce, comparable across world sizes).
// --master-host puts Gloo on the local address that routes to HOST (as hetseq-train does for its rendezvous host);
// --secret-file runs Gloo's pairs over TLS with the job's identity (Note [Gloo over TLS]), for
// benchmarks/gloo_tls_cost.sh. The file store itself is not sealed here: it only carries Gloo's addresses.
#include <algorithm>
#include <chrono>
#include <iostream>

#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/torch.h>

#include "hetseq/core/error.h"
#include "hetseq/core/format.h"
#include "hetseq/core/parse.h"
#include "hetseq/reduce/ddp_reducer.h"
#include "hetseq/world/gloo_tls.h"
#include "hetseq/world/job_secret.h"
#include "hetseq/world/process_group.h"
#include "tasks/mnist/mnist_model.h"

namespace {

struct Synthetic : torch::nn::Module {
  explicit Synthetic(int64_t numel) {
    const int64_t parts = 16;
    for (int64_t i = 0; i < parts; ++i) {
      register_parameter(fmt::format("p{}", i), torch::zeros({numel / parts + (i < numel % parts ? 1 : 0)}));
    }
  }
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int run(int argc, char** argv) {
  int64_t world = 0, rank = -1, numel = 0, iters = 30;
  double bucket_cap_mb = 25;
  std::string store_file, model_name = "mnist", shared_memory = "auto", master_host, secret_file;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--world-size") world = hetseq::parse_int(flag, value);
    else if (flag == "--rank") rank = hetseq::parse_int(flag, value);
    else if (flag == "--store-file") store_file = value;
    else if (flag == "--model") model_name = value;
    else if (flag == "--numel") { numel = hetseq::parse_int(flag, value); model_name = "synthetic"; }
    else if (flag == "--iters") iters = hetseq::parse_int(flag, value);
    else if (flag == "--bucket-cap-mb") bucket_cap_mb = hetseq::parse_double(flag, value);
    else if (flag == "--shared-memory-reduce") shared_memory = value;
    else if (flag == "--master-host") master_host = value;
    else if (flag == "--secret-file") secret_file = value;
    else throw hetseq::UsageError(fmt::format("unknown flag {}", flag));
  }
  if (world < 2 || rank < 0 || rank >= world || store_file.empty() || iters < 1) {
    throw hetseq::UsageError("need --world-size W >= 2, --rank in [0, W), --store-file PATH, --iters >= 1");
  }
  torch::set_num_threads(1);
  std::shared_ptr<torch::nn::Module> model;
  if (model_name == "mnist") model = std::make_shared<hetseq::mnist::MnistNetImpl>();
  else if (model_name == "synthetic" && numel > 0) model = std::make_shared<Synthetic>(numel);
  else throw hetseq::UsageError("--model mnist, or --numel N > 0");
  int64_t total = 0;
  for (const auto& p : model->parameters()) total += p.numel();

  auto store = c10::make_intrusive<c10d::FileStore>(store_file, static_cast<int>(world));
  hetseq::ProcessGroupOptions pg_options;
  pg_options.master_host = master_host;
  if (!secret_file.empty()) {
    pg_options.tls = std::make_shared<const hetseq::GlooTls>(hetseq::JobSecret::load(secret_file, "--secret-file"));
  }
  auto group = hetseq::make_process_group(store, rank, world, pg_options);
  hetseq::DdpOptions ddp_options;
  ddp_options.bucket_cap_mb = bucket_cap_mb;
  ddp_options.shared_memory = hetseq::parse_shared_memory_reduce(shared_memory);
  hetseq::DistributedReducer reducer(*model, group, ddp_options);
  auto params = model->parameters();

  using Clock = std::chrono::steady_clock;
  std::vector<double> reduce_s, raw_s, local_s;
  torch::Tensor flat = torch::ones({total});
  for (int64_t it = 0; it < iters + 3; ++it) {  // the first 3 are warm-up (bucket rebuild, connections)
    // Local backward alone: what the gradient side costs without communication.
    for (auto& p : params) p.mutable_grad() = torch::Tensor();
    auto t0 = Clock::now();
    {
      torch::Tensor loss = torch::zeros({});
      for (const auto& p : params) loss = loss + p.sum();
      loss.backward();
    }
    const double local = std::chrono::duration<double>(Clock::now() - t0).count();

    for (auto& p : params) p.grad().zero_();
    group->barrier()->wait();
    t0 = Clock::now();
    torch::Tensor loss = torch::zeros({});
    for (const auto& p : params) loss = loss + p.sum();
    reducer.before_backward(0, 1, loss);
    loss.backward();
    const double reduce = std::chrono::duration<double>(Clock::now() - t0).count();
    reducer.finish_update();

    group->barrier()->wait();
    t0 = Clock::now();
    std::vector<torch::Tensor> tensors{flat};
    group->allreduce(tensors)->wait();
    const double raw = std::chrono::duration<double>(Clock::now() - t0).count();
    if (it >= 3) {
      reduce_s.push_back(reduce);
      raw_s.push_back(raw);
      local_s.push_back(local);
    }
  }
  if (rank == 0) {
    const double bytes = 4.0 * static_cast<double>(total);
    const double factor = 2.0 * static_cast<double>(world - 1) / static_cast<double>(world);
    auto line = [&](const char* side, double s, int64_t buckets) {
      std::cout << fmt::format(
                       "{{\"side\": \"{}\", \"model\": \"{}\", \"world_size\": {}, \"bytes\": {}, \"buckets\": {}, "
                       "\"median_ms\": {:.3f}, \"algbw_GBps\": {:.3f}, \"busbw_GBps\": {:.3f}}}",
                       side, model_name, world, static_cast<int64_t>(bytes), buckets, 1e3 * s, bytes / s / 1e9,
                       bytes / s / 1e9 * factor)
                << std::endl;
    };
    line("hetseq_reducer", median(reduce_s), static_cast<int64_t>(reducer.bucket_sizes().size()));
    line("raw_allreduce", median(raw_s), 1);
    std::cout << fmt::format("{{\"side\": \"local_backward\", \"median_ms\": {:.3f}}}", 1e3 * median(local_s))
              << std::endl;
  }
  group->barrier()->wait();
  std::cout.flush();
  std::_Exit(0);  // Gloo's teardown can spin; the results are out
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const hetseq::UsageError& e) {
    std::cerr << "reduction-bandwidth: error: " << e.what() << std::endl;
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "reduction-bandwidth: error: " << e.what() << std::endl;
    return 1;
  }
}
