// Which CUDA device a worker takes, from its local rank or --device-id and the devices it sees
// (a pure decision, so it is checked without a GPU).
#include <catch2/catch.hpp>

#include "hetseq/core/error.h"
#include "hetseq/world/world.h"
#include "support/error_message.h"

using hetseq::cuda_device_for;
using hetseq::UsageError;
using hetseq::test::error_of;

TEST_CASE("A worker's CUDA device: its local rank among all of a node's devices", "[slurm][device]") {
  CHECK(cuda_device_for(0, 0, 4) == 0);
  CHECK(cuda_device_for(3, 0, 4) == 3);
  CHECK(cuda_device_for(2, 1, 4) == 2);  // the launcher's local rank wins over --device-id
}

TEST_CASE("A worker's CUDA device: the one device it sees when its launcher gave each worker one", "[slurm][device]") {
  // srun --gpus-per-task=1: SLURM_LOCALID 3, CUDA_VISIBLE_DEVICES=3, so the process sees one device, 0.
  CHECK(cuda_device_for(3, 0, 1) == 0);
  CHECK(cuda_device_for(1, 0, 1) == 0);
}

TEST_CASE("A worker's CUDA device: --device-id without a local rank", "[slurm][device]") {
  CHECK(cuda_device_for(std::nullopt, 0, 1) == 0);
  CHECK(cuda_device_for(std::nullopt, 2, 4) == 2);
  CHECK_THAT(error_of<UsageError>([] { cuda_device_for(std::nullopt, 4, 4); }),
             Catch::StartsWith("--device-id 4: this process sees 4 CUDA device(s)"));
  CHECK_THAT(error_of<UsageError>([] { cuda_device_for(std::nullopt, 1, 1); }),
             Catch::StartsWith("--device-id 1: this process sees 1 CUDA device(s)"));
}

TEST_CASE("A worker's CUDA device: a local rank beyond several visible devices is an error naming it",
          "[slurm][device]") {
  CHECK_THAT(error_of<UsageError>([] { cuda_device_for(5, 0, 4); }),
             Catch::StartsWith("local rank 5 (from the launcher's environment) has no CUDA device: this process "
                               "sees 4") &&
                 Catch::Contains("--gpus-per-task=1"));
}
