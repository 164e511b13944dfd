// BERT's loss on a GPU finds the masked tokens without a host-device synchronisation: their positions come with the
// batch, found on the host by collate (Note [BERT loss and sample size]), where nonzero on the device would make
// the host wait every step. Skipped, visibly, where no CUDA device is (see cuda/cuda_skip.h); the CPU tests in
// tests/bert/ check the positions and the loss.
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <torch/torch.h>

#ifdef HETSEQ_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#endif

#include "bert/shard_writer.h"
#include "cuda/cuda_skip.h"
#include "support/run_output.h"
#include "support/subprocess.h"
#include "support/temp_dir.h"
#include "support/test_paths.h"
#include "tasks/bert/bert_config.h"
#include "tasks/bert/bert_dataset.h"
#include "tasks/bert/bert_task.h"

using namespace hetseq;
using namespace hetseq::test;

TEST_CASE("CUDA: BERT's loss on a GPU makes no host-device synchronisation and equals the CPU's", "[cuda][bert]") {
  if (!cuda_or_skip()) return;
#ifdef HETSEQ_WITH_CUDA
  TempDir dir;
  write_shard(dir / "tiny_train_0.hdf5", make_shard(24, 16, 4));
  bert::BertTaskOptions o;
  o.data = dir.path();
  o.config_file = source_dir() + "/configs/bert-tiny.json";
  o.config = bert::read_bert_config(o.config_file);
  bert::BertTask task(o);
  torch::manual_seed(1);
  auto model = task.build_model();
  model->eval();
  const Batch batch = task.load_dataset("train")->collate({0, 3, 5, 8, 13, 21});
  const StepOutput on_cpu = task.valid_step(*model, batch);

  const torch::Device gpu(torch::kCUDA, 0);
  model->to(gpu);
  const Batch on_gpu = batch.pin_memory().to(gpu);
  StepOutput out;
  {
    // Any host wait in the loss is an error now (c10's sync debug mode).
    c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_ERROR);
    try {
      out = task.valid_step(*model, on_gpu);
    } catch (...) {
      c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_DISABLED);
      FAIL("the BERT loss synchronised with the host");
    }
    // The control: finding the masked tokens on the device, as the loss did before, does wait.
    CHECK_THROWS(on_gpu.at("masked_lm_labels").reshape({-1}).ne(-1).nonzero());
    c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_DISABLED);
  }
  CHECK(out.log.at("ntokens") == 12);  // 2 masked tokens in each of 6 rows, known on the host
  CHECK(out.loss.item<double>() == Approx(on_cpu.loss.item<double>()).epsilon(1e-5));
#endif
}

// Note [CUDA-graph updates] on a GPU: tiny BERT with --cuda-graph is captured after its eager warm-ups (update
// kGraphWarmUps + 1, the fourth), Adam's step with the rest, replays the rest, trains a short last batch uncaptured,
// and gives the losses of the same run uncaptured (both with the
// batches of one shape that --cuda-graph asks of the task; dropout's masks are drawn anew in each replay from
// the update's seed, so the two runs see the same masks only if the graph reads the generator as eager kernels
// do: the tolerance allows for a different rounding of the fused kernels, not for other masks).
TEST_CASE("CUDA: --cuda-graph replays tiny BERT's updates and trains as without it", "[cuda][bert]") {
  if (!cuda_or_skip()) return;
  TempDir dir;
  write_shard(dir / "tiny_train_0.hdf5", make_shard(76, 16, 4));  // 9 updates of 8, then one of 4
  auto run = [&](bool graph) {
    std::vector<std::string> args{"--task", "bert", "--data", dir.path(), "--config_file",
                                  source_dir() + "/configs/bert-tiny.json", "--device-id", "0", "--max-sentences", "8",
                                  "--max-epoch", "1", "--optimizer", "adam", "--lr", "0.001", "--clip-norm", "0.5",
                                  "--lr_scheduler", "fixed", "--max_pred_length", "4", "--disable-validation",
                                  "--no-save", "--log-format", "json", "--log-interval", "1", "--num-workers", "1",
                                  "--seed", "5", "--step-profile", "3,5"};
    if (graph) args.push_back("--cuda-graph");
    return run_hetseq_train(args);
  };
  const auto eager = run(false);
  INFO(eager.err);
  REQUIRE(eager.exit_code == 0);
  const auto graphed = run(true);
  INFO(graphed.err);
  REQUIRE(graphed.exit_code == 0);
  // Adam's step in the graph, its numbers filled before each replay (Note [The step in a CUDA graph]).
  CHECK_THAT(graphed.err, Catch::Contains("clipping and the optimizer step captured once and replayed"));
  CHECK_THAT(graphed.err, Catch::Contains("[cuda-graph] update 4 captured"));  // after 3 warm-ups (kGraphWarmUps)
  CHECK_THAT(graphed.err, !Catch::Contains("is not replayed"));  // no value frozen at the capture changed
  CHECK_THAT(graphed.err, Catch::Contains("[cuda-graph] update 10 has 1 micro-batch(es) of 4 samples"));
  const auto a = json_lines(eager.out, "train"), b = json_lines(graphed.out, "train");
  REQUIRE(a.size() >= 9);  // a line for each update (the epoch's last may be its train_epoch line only)
  REQUIRE(b.size() == a.size());
  for (size_t u = 0; u < a.size(); ++u) {
    INFO("update " << u + 1);
    CHECK(b[u]["loss"].get<double>() == Approx(a[u]["loss"].get<double>()).epsilon(1e-3));
  }
  // Replays launch far fewer operators from the host than eager updates, and read nothing inside an update.
  const auto pa = json_lines(eager.out, "step_profile"), pb = json_lines(graphed.out, "step_profile");
  REQUIRE(pa.size() == 1);
  REQUIRE(pb.size() == 1);
  CHECK(pb[0]["aten_ops_per_update"].get<double>() < 0.5 * pa[0]["aten_ops_per_update"].get<double>());
  CHECK(pb[0]["host_reads_per_update"] == 0);
}
