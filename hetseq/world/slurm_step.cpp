#include "hetseq/world/slurm_step.h"

#include <algorithm>

#include "hetseq/core/error.h"
#include "hetseq/core/parse.h"

namespace hetseq {
namespace {

constexpr int64_t kMaxNodes = 1 << 20;  // far above any Slurm cluster; guards against a runaway (xREPEAT)

std::optional<std::string> lookup(const std::map<std::string, std::string>& env, const std::string& key) {
  auto it = env.find(key);
  if (it == env.end() || it->second.empty()) return std::nullopt;
  return it->second;
}

}  // namespace

bool SlurmTask::one_task_per_node() const {
  return !tasks_per_node.empty() &&
         std::all_of(tasks_per_node.begin(), tasks_per_node.end(), [](int64_t n) { return n == 1; });
}

std::vector<int64_t> parse_tasks_per_node(const std::string& variable, const std::string& text) {
  auto malformed = [&](const std::string& why) {
    return UsageError(fmt::format("{}='{}': {}; Slurm writes one count per node, runs as COUNT(xREPEAT), "
                                  "e.g. '2(x3),1'",
                                  variable, text, why));
  };
  std::vector<int64_t> counts;  // [node]
  size_t start = 0;
  while (true) {
    const size_t comma = text.find(',', start);
    const std::string item = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (item.empty()) throw malformed("an empty item");
    auto number = [&](const std::string& digits) {
      try {
        return parse_int(variable, digits);
      } catch (const UsageError&) {
        throw malformed(fmt::format("'{}' is not a count", item));
      }
    };
    int64_t count = 0, repeat = 1;
    const size_t paren = item.find('(');
    if (paren == std::string::npos) {
      count = number(item);
    } else {
      if (item.size() < paren + 4 || item.compare(paren, 2, "(x") != 0 || item.back() != ')') {
        throw malformed(fmt::format("'{}' is not COUNT(xREPEAT)", item));
      }
      count = number(item.substr(0, paren));
      repeat = number(item.substr(paren + 2, item.size() - paren - 3));
    }
    if (count < 1 || repeat < 1) throw malformed(fmt::format("'{}' has a count below 1", item));
    if (repeat > kMaxNodes - static_cast<int64_t>(counts.size())) {
      throw malformed(fmt::format("more than {} nodes", kMaxNodes));
    }
    counts.insert(counts.end(), static_cast<size_t>(repeat), count);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return counts;
}

std::optional<SlurmTask> slurm_task(const std::map<std::string, std::string>& env) {
  const auto procid = lookup(env, "SLURM_PROCID");
  const auto ntasks = lookup(env, "SLURM_NTASKS");
  if (!procid || !ntasks) return std::nullopt;
  SlurmTask task;
  task.rank = parse_int("SLURM_PROCID", *procid);
  task.tasks = parse_int("SLURM_NTASKS", *ntasks);
  if (task.tasks < 1) throw UsageError(fmt::format("SLURM_NTASKS={} is not a positive number of tasks", task.tasks));
  if (task.rank < 0 || task.rank >= task.tasks) {
    throw UsageError(fmt::format("SLURM_PROCID={} is outside 0..{} (SLURM_NTASKS={})", task.rank, task.tasks - 1,
                                 task.tasks));
  }
  if (const auto layout = lookup(env, "SLURM_STEP_TASKS_PER_NODE")) {
    task.tasks_per_node_text = *layout;
    task.tasks_per_node = parse_tasks_per_node("SLURM_STEP_TASKS_PER_NODE", *layout);
    int64_t total = 0;
    for (int64_t n : task.tasks_per_node) total += n;
    if (total != task.tasks) {
      throw UsageError(fmt::format("SLURM_STEP_TASKS_PER_NODE='{}' places {} tasks but SLURM_NTASKS is {}", *layout,
                                   total, task.tasks));
    }
  }
  return task;
}

}  // namespace hetseq
