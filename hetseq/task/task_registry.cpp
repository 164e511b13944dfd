#include "hetseq/task/task_registry.h"

#include "hetseq/core/error.h"

namespace hetseq {

TaskRegistry& TaskRegistry::global() {
  static TaskRegistry registry;
  return registry;
}

void TaskRegistry::add(TaskSpec spec) {
  HETSEQ_ASSERT(!spec.name.empty() && spec.create, "a task registered without name or factory");
  const std::string name = spec.name;
  const bool inserted = specs_.emplace(name, std::move(spec)).second;
  HETSEQ_ASSERT(inserted, "task '{}' registered twice", name);
}

const TaskSpec& TaskRegistry::get(const std::string& name) const {
  auto it = specs_.find(name);
  if (it == specs_.end()) {
    throw UsageError(fmt::format("--task: unknown task '{}'; known tasks: {}", name,
                                 fmt::join(names(), ", ")));
  }
  return it->second;
}

bool TaskRegistry::contains(const std::string& name) const { return specs_.count(name) != 0; }

std::vector<std::string> TaskRegistry::names() const {
  std::vector<std::string> out;
  for (const auto& [name, spec] : specs_) out.push_back(name);
  return out;
}

}  // namespace hetseq
