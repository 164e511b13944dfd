#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch/types.h>

#include "hetseq/core/flag_set.h"
#include "hetseq/optim/lr_scheduler.h"
#include "hetseq/optim/optimizer.h"

namespace hetseq::optim {

/// Builds the configured optimizer over a model's parameters.
using OptimizerFactory = std::function<std::unique_ptr<Optimizer>(std::vector<torch::Tensor> params)>;
/// Builds the configured LR schedule over an optimizer.
using LrSchedulerFactory = std::function<std::unique_ptr<LrScheduler>(Optimizer& optimizer)>;

/// The flags that several optimizers or schedules read, defined once in the driver's groups.
struct CommonOptimOptions {
  std::vector<double> lrs;              // --lr, one per epoch
  double weight_decay = 0;              // --weight-decay (adam: decoupled; sgd: L2)
  int64_t warmup_updates = 0;           // --warmup-updates
  std::optional<int64_t> force_anneal;  // --force-anneal
};



/// How an optimizer presents itself (like a TaskSpec): its --optimizer name, its own flags, and how
/// they are read. `configure` reads and validates its flags (hetseq::UsageError naming the flag)
/// before any work starts, and returns the factory used once the model exists.
struct OptimizerSpec {
  std::string name;
  std::function<void(FlagSet&)> flags;  // its flags (the driver shows them in the "Optimizer" group)
  std::function<OptimizerFactory(const FlagValues&, const CommonOptimOptions&)> configure;
};

/// How an LR schedule presents itself: its --lr-scheduler name, its own flags, and how they are read.
struct LrSchedulerSpec {
  std::string name;
  std::function<void(FlagSet&)> flags;  // its flags (in the "Learning rate scheduler" group)
  std::function<LrSchedulerFactory(const FlagValues&, const CommonOptimOptions&)> configure;
};

/// Specs by name, for one flag (--optimizer or --lr_scheduler).
template <class Spec>
class Registry {
 public:
  explicit Registry(std::string flag) : flag_(std::move(flag)) {}
  /// Adds a spec; throws hetseq::InternalError when the name is taken.
  void add(Spec spec);
  /// The spec called `name`; throws hetseq::UsageError naming the flag and the known names otherwise.
  const Spec& get(const std::string& name) const;
  std::vector<std::string> names() const;
  /// Declares every spec's flags in `flags`.
  void declare_flags(FlagSet& flags) const {
    for (const auto& entry : specs_) {
      if (entry.second.flags) entry.second.flags(flags);
    }
  }

 private:
  std::string flag_;
  std::map<std::string, Spec> specs_;
};

/// The optimizers (adam, adadelta, sgd) and LR schedules (PolynomialDecayScheduler, fixed,
/// inverse_sqrt), registered by name; each one's flags are defined, read and validated in its own file.
Registry<OptimizerSpec>& optimizers();
Registry<LrSchedulerSpec>& lr_schedulers();

}  // namespace hetseq::optim
