#pragma once
/// Where a process started by Slurm stands: its task in the job step and how the step's tasks are
/// laid out over the nodes, read from the variables Slurm sets (see Note [Spawning under Slurm] in
/// hetseq/cli/spawn.cpp for how hetseq-train uses them).

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace hetseq {

/// One task of a Slurm job step, as its environment describes it.
struct SlurmTask {
  int64_t rank = 0;   // SLURM_PROCID: this task's rank in the step
  int64_t tasks = 1;  // SLURM_NTASKS: tasks in the step
  /// The step's tasks on each of its nodes [node], from SLURM_STEP_TASKS_PER_NODE; empty when that is
  /// unset, i.e. the process is not one of srun's tasks (e.g. the batch script itself).
  std::vector<int64_t> tasks_per_node;
  std::string tasks_per_node_text;  // SLURM_STEP_TASKS_PER_NODE as Slurm wrote it, for messages

  /// Whether every node of the step runs exactly one task (srun --ntasks-per-node 1).
  bool one_task_per_node() const;
};

/// The task this process is, when SLURM_PROCID and SLURM_NTASKS are both set (else nullopt). Throws
/// hetseq::UsageError naming the variable that is malformed or out of range.
std::optional<SlurmTask> slurm_task(const std::map<std::string, std::string>& environment);

/// Parses Slurm's tasks-per-node format, one count per node with runs of equal counts written
/// `COUNT(xREPEAT)`: "2(x3),1" is {2, 2, 2, 1}. Throws hetseq::UsageError naming `variable`.
std::vector<int64_t> parse_tasks_per_node(const std::string& variable, const std::string& text);

}  // namespace hetseq
