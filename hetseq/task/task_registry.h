#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <cxxopts.hpp>

#include "hetseq/task/task.h"

namespace hetseq {

namespace detail {
struct TaskRegistration;
}  // namespace detail

/// How a task presents itself to the driver.
struct TaskSpec {
  std::string name;         // the value of --task
  std::string description;  // one line for --help
  /// Adds the task's own flags to the command line (in a group named after the task).
  std::function<void(cxxopts::Options&)> add_options;
  /// Defaults the task chooses for general flags, by long flag name without dashes
  /// (e.g. {"valid-subset", "test"}). They replace the general defaults when --task names this task.
  std::map<std::string, std::string> defaults;
  /// Builds the task from the parsed command line. Throws hetseq::UsageError on bad task flags.
  std::function<std::unique_ptr<Task>(const cxxopts::ParseResult&, const TaskContext&)> create;
};

/// Tasks by name. Tasks add themselves at static-initialisation time with HETSEQ_REGISTER_TASK.
class TaskRegistry {
 public:
  static TaskRegistry& global();
  /// Adds a task; throws hetseq::InternalError when the name is taken.
  void add(TaskSpec spec);
  /// The task called `name`; throws hetseq::UsageError naming --task and the known tasks otherwise.
  const TaskSpec& get(const std::string& name) const;
  bool contains(const std::string& name) const;
  std::vector<std::string> names() const;

  /// Registrations that failed at static-initialisation time (a name taken twice, a throwing spec), as
  /// one message each, and forgets them. Nothing may throw out of a static initialiser (least of all out
  /// of a library being dlopen'ed by --user-dir), so HETSEQ_REGISTER_TASK records the failure here and
  /// the driver reports it.
  std::vector<std::string> take_registration_errors();

  /// Throws hetseq::InternalError with the first failed registration (see take_registration_errors).
  void check_registrations();

 private:
  friend struct detail::TaskRegistration;
  std::map<std::string, TaskSpec> specs_;
  std::vector<std::string> registration_errors_;
};

namespace detail {
struct TaskRegistration {
  /// Adds `make_spec()` to the global registry; never throws (see take_registration_errors).
  explicit TaskRegistration(TaskSpec (*make_spec)()) noexcept;
};
}  // namespace detail

}  // namespace hetseq

/// Registers the task described by `make_spec` (a function returning hetseq::TaskSpec). Use once, in
/// the task's own .cpp file, at namespace scope. The task's object files must be linked whole (the
/// `hetseq_tasks` object library does this), or the registration is dropped by the linker.
#define HETSEQ_REGISTER_TASK(ident, make_spec) \
  static const ::hetseq::detail::TaskRegistration hetseq_task_registration_##ident{make_spec}
