// How hetseq-train decides between being one worker and spawning a node's workers, from its flags,
// the Slurm variables and the GPUs it sees (see Note [Spawning under Slurm]).
#include <catch2/catch.hpp>

#include "hetseq/cli/spawn.h"
#include "hetseq/core/error.h"
#include "support/error_message.h"

using hetseq::UsageError;
using hetseq::cli::plan_spawn;
using hetseq::cli::SpawnPlan;
using hetseq::TrainOptions;
using hetseq::test::error_of;
using Env = std::map<std::string, std::string>;

namespace {

TrainOptions options() {
  TrainOptions o;
  o.dataset.max_sentences = {32};
  return o;
}

TrainOptions cpu_with_gpus(int64_t gpus) {
  TrainOptions o = options();
  o.common.cpu = true;
  o.distributed.gpus = gpus;
  return o;
}

// The variables srun sets in task `procid` of `ntasks` laid out as `layout` on node[001-...].
Env srun_task(int64_t procid, int64_t ntasks, const std::string& layout) {
  return {{"SLURM_PROCID", std::to_string(procid)},
          {"SLURM_NTASKS", std::to_string(ntasks)},
          {"SLURM_STEP_TASKS_PER_NODE", layout},
          {"SLURM_TASKS_PER_NODE", layout},
          {"SLURM_JOB_NODELIST", "node[001-004]"}};
}

}  // namespace

TEST_CASE("Without Slurm a node spawns --distributed-gpus or its visible GPUs and a lone worker spawns nothing", "[spawn]") {
  CHECK(plan_spawn(options(), {}, 0).workers == 1);
  const SpawnPlan gpus = plan_spawn(options(), {}, 4);
  CHECK(gpus.workers == 4);
  CHECK(gpus.first_rank == 0);
  CHECK(gpus.world_size == 4);
  CHECK(gpus.init_method == "tcp://127.0.0.1:0");
  CHECK(gpus.host_store);
  TrainOptions cpu = options();
  cpu.common.cpu = true;
  CHECK(plan_spawn(cpu, {}, 4).workers == 1);  // --cpu ignores the GPUs
  CHECK(plan_spawn(cpu_with_gpus(3), {}, 0).workers == 3);
  TrainOptions no_spawn = options();
  no_spawn.distributed.no_spawn = true;
  CHECK(plan_spawn(no_spawn, {}, 4).workers == 1);
}

TEST_CASE("A node of a multi-node world without Slurm needs --distributed-init-method and hosts tcp:// when it holds rank 0",
          "[spawn]") {
  TrainOptions o = options();
  o.distributed.world.world_size = 8;
  o.distributed.world.rank = 4;
  o.distributed.world.rank_given = true;
  CHECK_THAT(error_of<UsageError>([&] { plan_spawn(o, {}, 4); }), Catch::Contains("--distributed-init-method is needed"));
  o.distributed.world.init_method = "tcp://10.0.0.1:23456";
  const SpawnPlan second = plan_spawn(o, {}, 4);
  CHECK(second.workers == 4);
  CHECK(second.first_rank == 4);
  CHECK(second.world_size == 8);
  CHECK(second.init_method == "tcp://10.0.0.1:23456");
  CHECK_FALSE(second.host_store);
  o.distributed.world.rank = 0;
  CHECK(plan_spawn(o, {}, 4).host_store);
}

TEST_CASE("Under Slurm with several tasks per node each task is one worker even when it sees every GPU", "[spawn][slurm]") {
  // srun --nodes 2 --ntasks-per-node 4 on nodes with 4 GPUs, all visible to every task.
  for (int64_t procid = 0; procid < 8; ++procid) {
    INFO("SLURM_PROCID=" << procid);
    CHECK(plan_spawn(options(), srun_task(procid, 8, "4(x2)"), 4).workers == 1);
  }
  // srun --ntasks 2 on one CPU node.
  CHECK(plan_spawn(options(), srun_task(1, 2, "2"), 0).workers == 1);
  // A layout with one task on some nodes and several on others: one worker per task everywhere.
  CHECK(plan_spawn(options(), srun_task(0, 3, "1,2"), 2).workers == 1);
  CHECK(plan_spawn(options(), srun_task(2, 3, "1,2"), 2).workers == 1);
  // --distributed-gpus 1 agrees.
  CHECK(plan_spawn(cpu_with_gpus(1), srun_task(0, 8, "4(x2)"), 4).workers == 1);
}

TEST_CASE("Under Slurm with several tasks per node asking for several workers per task is an error", "[spawn][slurm]") {
  const std::string message = error_of<UsageError>([] { plan_spawn(cpu_with_gpus(4), srun_task(0, 8, "4(x2)"), 4); });
  CHECK_THAT(message, Catch::StartsWith("--distributed-gpus 4:") &&
                          Catch::Contains("SLURM_STEP_TASKS_PER_NODE=4(x2)") &&
                          Catch::Contains("srun --ntasks-per-node 1"));
}

TEST_CASE("Under Slurm with one task per node each task spawns its GPUs' workers into one world", "[spawn][slurm]") {
  // sbatch --nodes 2 --ntasks-per-node 1 --gres gpu:4; srun hetseq-train ...
  const SpawnPlan first = plan_spawn(options(), srun_task(0, 2, "1(x2)"), 4);
  CHECK(first.workers == 4);
  CHECK(first.first_rank == 0);
  CHECK(first.world_size == 8);
  CHECK(first.init_method == "tcp://node001:29500");  // the first node of SLURM_JOB_NODELIST
  CHECK(first.host_store);
  const SpawnPlan second = plan_spawn(options(), srun_task(1, 2, "1(x2)"), 4);
  CHECK(second.workers == 4);
  CHECK(second.first_rank == 4);
  CHECK(second.world_size == 8);
  CHECK(second.init_method == "tcp://node001:29500");
  CHECK_FALSE(second.host_store);

  // MASTER_ADDR and MASTER_PORT, as the batch script sets them.
  Env env = srun_task(2, 3, "1(x3)");
  env["MASTER_ADDR"] = "10.1.2.3";
  env["MASTER_PORT"] = "12345";
  const SpawnPlan third = plan_spawn(cpu_with_gpus(2), env, 0);
  CHECK(third.workers == 2);
  CHECK(third.first_rank == 4);
  CHECK(third.world_size == 6);
  CHECK(third.init_method == "tcp://10.1.2.3:12345");
  CHECK_FALSE(third.host_store);

  // One GPU per node: nothing to spawn, the World reads SLURM_PROCID and SLURM_NTASKS.
  CHECK(plan_spawn(options(), srun_task(1, 2, "1(x2)"), 1).workers == 1);
  TrainOptions cpu = options();
  cpu.common.cpu = true;
  CHECK(plan_spawn(cpu, srun_task(1, 2, "1(x2)"), 4).workers == 1);
}

TEST_CASE("Under Slurm with one task per node the world size and rank flags must agree with Slurm's", "[spawn][slurm]") {
  TrainOptions o = cpu_with_gpus(4);
  o.distributed.world.world_size = 8;
  CHECK(plan_spawn(o, srun_task(1, 2, "1(x2)"), 0).world_size == 8);
  o.distributed.world.world_size = 6;
  CHECK_THAT(error_of<UsageError>([&] { plan_spawn(o, srun_task(1, 2, "1(x2)"), 0); }),
             Catch::StartsWith("--distributed-world-size 6 but SLURM_NTASKS=2 tasks, one per node") &&
                 Catch::Contains("x 4 workers each (--distributed-gpus) make 8 ranks"));
  o.distributed.world.world_size.reset();
  o.distributed.world.rank = 2;
  o.distributed.world.rank_given = true;
  CHECK_THAT(error_of<UsageError>([&] { plan_spawn(o, srun_task(1, 2, "1(x2)"), 0); }),
             Catch::StartsWith("--distributed-rank 2 but task SLURM_PROCID=1") && Catch::Contains("starts at rank 4"));
  o.distributed.world.rank = 4;
  CHECK(plan_spawn(o, srun_task(1, 2, "1(x2)"), 0).first_rank == 4);
}

TEST_CASE("Under Slurm the batch script itself is told to use srun", "[spawn][slurm]") {
  const Env batch{{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_TASKS_PER_NODE", "1(x2)"},
                  {"SLURM_JOB_NODELIST", "node[001-002]"}};
  CHECK_THAT(error_of<UsageError>([&] { plan_spawn(options(), batch, 4); }),
             Catch::Contains("SLURM_STEP_TASKS_PER_NODE is unset") && Catch::Contains("srun hetseq-train"));
}

TEST_CASE("Slurm adds nothing to a single task and an explicit init method leaves Slurm's variables alone", "[spawn][slurm]") {
  const SpawnPlan alone = plan_spawn(options(), srun_task(0, 1, "1"), 2);
  CHECK(alone.workers == 2);
  CHECK(alone.world_size == 2);
  CHECK(alone.init_method == "tcp://127.0.0.1:0");

  // HetSeq's own per-node command lines inside a Slurm job: the flags decide.
  TrainOptions o = options();
  o.distributed.world.init_method = "tcp://10.0.0.1:23456";
  o.distributed.world.world_size = 8;
  o.distributed.world.rank = 4;
  o.distributed.world.rank_given = true;
  const SpawnPlan flags = plan_spawn(o, srun_task(1, 8, "4(x2)"), 4);
  CHECK(flags.workers == 4);
  CHECK(flags.first_rank == 4);
  CHECK(flags.world_size == 8);
}

TEST_CASE("tcp:// port 0 is refused at once when the world holds ranks this command does not start (Note [Port 0])",
          "[spawn]") {
  // One CPU worker of a world of 2: the random port could never reach rank 1.
  TrainOptions lone = options();
  lone.common.cpu = true;
  lone.distributed.world.world_size = 2;
  lone.distributed.world.init_method = "tcp://127.0.0.1:0";
  CHECK(error_of<UsageError>([&] { plan_spawn(lone, {}, 0); }) ==
        "--distributed-init-method tcp://127.0.0.1:0: port 0 picks a random port that only the workers this command "
        "starts can learn, but this command starts rank(s) 0..0 of --distributed-world-size 2; give a fixed port that "
        "every node reaches (e.g. tcp://127.0.0.1:29500), or start all 2 workers from this command "
        "(--distributed-gpus 2)");
  TrainOptions no_spawn = lone;
  no_spawn.distributed.no_spawn = true;
  CHECK_THAT(error_of<UsageError>([&] { plan_spawn(no_spawn, {}, 0); }), Catch::Contains("rank(s) 0..0 of"));
  // The second node of a world of 8 (ranks 4..7) cannot learn the port of the first either.
  TrainOptions second = cpu_with_gpus(4);
  second.distributed.world.world_size = 8;
  second.distributed.world.rank = 4;
  second.distributed.world.init_method = "tcp://10.0.0.1:0";
  CHECK_THAT(error_of<UsageError>([&] { plan_spawn(second, {}, 0); }),
             Catch::Contains("this command starts rank(s) 4..7 of --distributed-world-size 8") &&
                 Catch::Contains("e.g. tcp://10.0.0.1:29500"));

  // Every rank started here: the launcher hosts the store and tells its workers the port it got.
  TrainOptions all = cpu_with_gpus(2);
  all.distributed.world.world_size = 2;
  all.distributed.world.init_method = "tcp://127.0.0.1:0";
  const SpawnPlan plan = plan_spawn(all, {}, 0);
  CHECK(plan.workers == 2);
  CHECK(plan.init_method == "tcp://127.0.0.1:0");
  CHECK(plan.host_store);
  // A world of one needs no peer; a fixed port is never refused.
  TrainOptions one = lone;
  one.distributed.world.world_size = 1;
  CHECK(plan_spawn(one, {}, 0).workers == 1);
  lone.distributed.world.init_method = "tcp://127.0.0.1:29500";
  CHECK(plan_spawn(lone, {}, 0).workers == 1);
}
