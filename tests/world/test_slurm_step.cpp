// Reading a Slurm task's place in its step from the variables srun sets.
#include <catch2/catch.hpp>

#include "hetseq/core/error.h"
#include "hetseq/world/slurm_step.h"
#include "support/error_message.h"

using hetseq::parse_tasks_per_node;
using hetseq::slurm_task;
using hetseq::UsageError;
using hetseq::test::error_of;
using Env = std::map<std::string, std::string>;

TEST_CASE("Slurm's tasks-per-node lists expand to one count per node", "[slurm]") {
  using V = std::vector<int64_t>;
  CHECK(parse_tasks_per_node("V", "1") == V{1});
  CHECK(parse_tasks_per_node("V", "4") == V{4});
  CHECK(parse_tasks_per_node("V", "1(x3)") == V{1, 1, 1});
  CHECK(parse_tasks_per_node("V", "2(x3),1") == V{2, 2, 2, 1});
  CHECK(parse_tasks_per_node("V", "1,4(x2),3") == V{1, 4, 4, 3});
}

TEST_CASE("A malformed tasks-per-node list is an error naming the variable and its value", "[slurm]") {
  for (const std::string bad : {"", "2,", ",2", "x", "2(x)", "2(3)", "2(x3", "0", "2(x0)", "-1", "2(x3),a", "1(x99999999)"}) {
    INFO(bad);
    CHECK_THAT(error_of<UsageError>([&] { parse_tasks_per_node("SLURM_STEP_TASKS_PER_NODE", bad); }),
               Catch::StartsWith("SLURM_STEP_TASKS_PER_NODE='" + bad + "'"));
  }
}

TEST_CASE("A Slurm task is read from SLURM_PROCID and SLURM_NTASKS and SLURM_STEP_TASKS_PER_NODE", "[slurm]") {
  CHECK_FALSE(slurm_task({}));
  CHECK_FALSE(slurm_task({{"SLURM_PROCID", "0"}}));
  CHECK_FALSE(slurm_task({{"SLURM_NTASKS", "2"}}));

  const auto task = slurm_task({{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "8"}, {"SLURM_STEP_TASKS_PER_NODE", "4(x2)"}});
  REQUIRE(task);
  CHECK(task->rank == 5);
  CHECK(task->tasks == 8);
  CHECK(task->tasks_per_node == std::vector<int64_t>{4, 4});
  CHECK_FALSE(task->one_task_per_node());

  const auto per_node = slurm_task({{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "3"}, {"SLURM_STEP_TASKS_PER_NODE", "1(x3)"}});
  REQUIRE(per_node);
  CHECK(per_node->one_task_per_node());

  // The batch script: the job's variables, no step layout.
  const auto batch = slurm_task({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_TASKS_PER_NODE", "1(x2)"}});
  REQUIRE(batch);
  CHECK(batch->tasks_per_node.empty());
  CHECK_FALSE(batch->one_task_per_node());
}

TEST_CASE("Slurm variables that contradict each other are errors naming them", "[slurm]") {
  CHECK_THAT(error_of<UsageError>([] { slurm_task({{"SLURM_PROCID", "2"}, {"SLURM_NTASKS", "2"}}); }),
             Catch::Contains("SLURM_PROCID=2 is outside 0..1 (SLURM_NTASKS=2)"));
  CHECK_THAT(error_of<UsageError>([] { slurm_task({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "0"}}); }),
             Catch::Contains("SLURM_NTASKS=0"));
  CHECK_THAT(error_of<UsageError>([] { slurm_task({{"SLURM_PROCID", "one"}, {"SLURM_NTASKS", "2"}}); }),
             Catch::Contains("SLURM_PROCID"));
  CHECK_THAT(error_of<UsageError>([] {
               slurm_task({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "4"}, {"SLURM_STEP_TASKS_PER_NODE", "2(x3)"}});
             }),
             Catch::Contains("SLURM_STEP_TASKS_PER_NODE='2(x3)' places 6 tasks but SLURM_NTASKS is 4"));
}
