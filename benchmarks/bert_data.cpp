// The BERT data path alone, as one rank of hetseq-train runs it: the shards of --data read by the bert task's
// collate (tasks/bert/bert_dataset.cpp) on the loader's threads, pinned where CUDA is available (as for a CUDA
// rank), several updates ahead (UpdateStream), in the order of the data plan (a seeded permutation of the
// split). Nothing trains: the training thread only takes the batches. Prints one JSON line,
//   {"system":"hetseq-data","sequences_per_s":N,"batch":B,"workers":W,"ahead":K,"pinned":P,"batches":T}
// timed over T batches after K + 10 untimed ones (the queue filled, the shards opened, their first pages read).
//
//   build/bin/bert-data --data DIR [--batch 32] [--batches 2000] [--workers 2] [--ahead 8]
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>
#include <torch/cuda.h>

#include "hetseq/core/parse.h"
#include "hetseq/data/batch_loader.h"
#include "hetseq/data/data_plan.h"
#include "hetseq/data/epoch_batch_iterator.h"
#include "tasks/bert/bert_dataset.h"

int main(int argc, char** argv) {
  std::string data;
  int64_t batch = 32, batches = 2000, workers = 2, ahead = 8;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--data") data = value;
    else if (flag == "--batch") batch = hetseq::parse_int(flag, value);
    else if (flag == "--batches") batches = hetseq::parse_int(flag, value);
    else if (flag == "--workers") workers = hetseq::parse_int(flag, value);
    else if (flag == "--ahead") ahead = hetseq::parse_int(flag, value);
    else {
      std::fprintf(stderr, "bert-data: unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  if (data.empty()) {
    std::fprintf(stderr, "bert-data: --data DIR (a directory of BERT shards) is required\n");
    return 2;
  }
  hetseq::bert::BertDataOptions options;
  options.files = hetseq::bert::find_shards(data, "train", 0, "--data");
  auto dataset = std::make_shared<hetseq::bert::BertDataset>(options);
  const bool pin = torch::cuda::is_available();
  auto loader = std::make_shared<hetseq::BatchLoader>(dataset, hetseq::BatchLoaderOptions{workers, pin});
  hetseq::UpdateStream stream(
      hetseq::EpochBatchIterator(dataset->size(), hetseq::DataPlan::single(batch, 1), hetseq::EpochIteratorOptions{}),
      loader, ahead);
  int64_t epoch = 1;
  stream.begin_epoch(epoch);
  auto take = [&] {
    if (stream.end_of_epoch()) stream.begin_epoch(++epoch);
    return stream.next().front().num_samples;
  };
  for (int64_t i = 0; i < ahead + 10; ++i) take();
  int64_t sequences = 0;
  const auto start = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < batches; ++i) sequences += take();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  nlohmann::ordered_json j;
  j["system"] = "hetseq-data";
  j["sequences_per_s"] = static_cast<double>(sequences) / seconds;
  j["batch"] = batch;
  j["workers"] = workers;
  j["ahead"] = ahead;
  j["pinned"] = pin;
  j["batches"] = batches;
  j["shards"] = options.files.size();
  std::printf("%s\n", j.dump().c_str());
  return 0;
}
