// hetseq.train from Python: a registered C++ task (mnist, bert, or one a --user-dir library registers) trained in
// this process by hetseq::train (hetseq/session/train.h), with its options read from hetseq-train's flags by
// hetseq-train's own readers, so that a flag means, defaults to and is checked as on the command line.

#include <csignal>
#include <map>
#include <string>
#include <vector>

#include "bindings.h"
#include "hetseq/cli/train_options.h"
#include "hetseq/session/train.h"

namespace py = pybind11;

namespace hetseq::python {
namespace {

// Note [hetseq.train and Python's signals]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// hetseq::train installs its own handlers for SIGINT and SIGTERM once the session is built, so that a signal
// finishes the update in flight, saves checkpoint_last.pt and returns with `stopped` (Note [Clean stops]); and it
// leaves them installed. In a Python process SIGINT belongs to Python (KeyboardInterrupt), so the binding puts
// back the handlers that were there before the call, whatever way it ends. A signal during the call stops the
// run cleanly, as in hetseq-train, and the result says `stopped`.
class SignalHandlersKept {
 public:
  SignalHandlersKept() {
    sigaction(SIGINT, nullptr, &int_);
    sigaction(SIGTERM, nullptr, &term_);
  }
  ~SignalHandlersKept() {
    sigaction(SIGINT, &int_, nullptr);
    sigaction(SIGTERM, &term_, nullptr);
  }
  SignalHandlersKept(const SignalHandlersKept&) = delete;
  SignalHandlersKept& operator=(const SignalHandlersKept&) = delete;

 private:
  struct sigaction int_ {};
  struct sigaction term_ {};
};

TrainResult train_from_flags(const std::vector<std::string>& flags, const std::map<std::string, std::string>& task_flags) {
  std::vector<const char*> argv{"hetseq.train"};
  for (const auto& flag : flags) argv.push_back(flag.c_str());
  const int argc = static_cast<int>(argv.size());
  cli::load_user_dirs(argc, argv.data());
  cxxopts::Options parser = cli::make_train_parser(cli::find_task_flag(argc, argv.data()));
  const TrainOptions options = cli::read_train_options(cli::parse_command_line(parser, argc, argv.data()));
  const SignalHandlersKept kept;
  return hetseq::train(options, task_flags);
}

}  // namespace

void bind_train(py::module_& m) {
  m.def(
      "train",
      [](const std::vector<std::string>& flags, const std::map<std::string, std::string>& task_flags) {
        TrainResult r;
        {
          py::gil_scoped_release release;
          r = train_from_flags(flags, task_flags);
        }
        py::dict out;
        out["last_epoch"] = r.last_epoch;
        out["num_updates"] = r.num_updates;
        out["stopped"] = r.stopped;
        out["train"] = r.train;
        out["valid"] = r.valid;
        return out;
      },
      "Trains hetseq-train's `flags` (its command line after the program name, --task first among them) in this "
      "process, with `task_flags` {name: text} for the task; returns last_epoch, num_updates, stopped and the "
      "last train and valid statistics",
      py::arg("flags"), py::arg("task_flags"));
}

}  // namespace hetseq::python
