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

std::vector<std::string> TaskRegistry::take_registration_errors() {
  std::vector<std::string> out;
  out.swap(registration_errors_);
  return out;
}

void TaskRegistry::check_registrations() {
  const std::vector<std::string> errors = take_registration_errors();
  if (!errors.empty()) throw InternalError(errors.front());
}

namespace detail {

TaskRegistration::TaskRegistration(TaskSpec (*make_spec)()) noexcept {
  TaskRegistry& registry = TaskRegistry::global();
  try {
    registry.add(make_spec());
  } catch (const std::exception& e) {
    registry.registration_errors_.push_back(e.what());
  } catch (...) {
    registry.registration_errors_.push_back("a task's registration threw a non-standard exception");
  }
}

}  // namespace detail

bool TaskRegistry::contains(const std::string& name) const { return specs_.count(name) != 0; }

std::vector<std::string> TaskRegistry::names() const {
  std::vector<std::string> out;
  for (const auto& [name, spec] : specs_) out.push_back(name);
  return out;
}

}  // namespace hetseq
