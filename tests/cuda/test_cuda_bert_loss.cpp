// BERT's loss on a GPU finds the masked tokens without a host-device synchronisation: their positions come with the
// batch, found on the host by collate (Note [BERT loss and sample size]), where nonzero on the device would make
// the host wait every step. Skipped, visibly, where no CUDA device is (see cuda/cuda_skip.h); the CPU tests in
// tests/bert/ check the positions and the loss.
#include <string>

#include <catch2/catch.hpp>
#include <torch/torch.h>

#ifdef HETSEQ_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#endif

#include "bert/shard_writer.h"
#include "cuda/cuda_skip.h"
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
