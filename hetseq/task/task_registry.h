#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "hetseq/core/flag_set.h"
#include "hetseq/task/task.h"

namespace hetseq {

namespace detail {
struct TaskRegistration;
}  // namespace detail

/// How a task presents itself to the driver. Only `name` and `create` are required.
struct TaskSpec {
  std::string name;         // the value of --task
  std::string description;  // one line for --help
  /// Declares the task's own flags (shown in --help under `flag_group`, or "<name> task"). Every
  /// flag that is not per-rank is compared across ranks at start, the task's too.
  std::function<void(FlagSet&)> flags;
  std::string flag_group;
  /// Defaults the task chooses for general flags, by long flag name without dashes
  /// (e.g. {"valid-subset", "test"}). They replace the general defaults when --task names this task.
  std::map<std::string, std::string> defaults;
  /// Builds the task from the flags' values (general and the task's; FlagValues parses strictly and
  /// names the flag in its errors). Throws hetseq::UsageError on bad task flags.
  std::function<std::unique_ptr<Task>(const FlagValues&, const TaskContext&)> create;

  /// The group the task's flags are shown under.
  std::string group() const { return flag_group.empty() ? name + " task" : flag_group; }
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
