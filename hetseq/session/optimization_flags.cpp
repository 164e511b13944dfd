#include "hetseq/session/optimization_flags.h"

#include "hetseq/core/flag_text.h"
#include "hetseq/core/parse.h"
#include "hetseq/optim/common_optim_flags.h"

namespace hetseq {

void declare_optimization_flags(FlagSet& optimization, FlagSet& schedule, const OptimizationOptions& d) {
  optimization.add("max-epoch", "force stop training at this epoch (alias --me; 0: no limit)", flag_text(d.max_epoch))
      .add("max-update", "force stop training at this update (alias --mu; 0: no limit)", flag_text(d.max_update))
      .add("clip-norm", "clip threshold of gradients (0: no clipping)", flag_text(d.clip_norm))
      .add("update-freq", "update parameters every N_i batches in epoch i (comma list N1,N2,...)",
           flag_text(d.update_freq)).per_rank()
      .add("lr", "learning rate for the first epochs (comma list; alias --learning-rate)", flag_text(d.lr))
      .add("min-lr", "stop training when the learning rate reaches this minimum", flag_text(d.min_lr))
      .add("optimizer", fmt::format("{}", fmt::join(optim::optimizers().names(), ", ")), d.optimizer);
  schedule.add("lr_scheduler",
               fmt::format("{} (alias --lr-scheduler)", fmt::join(optim::lr_schedulers().names(), ", ")),
               d.lr_scheduler);
  optim::declare_common_optim_flags(optimization, schedule);
}

OptimizationOptions read_optimization_options(const FlagValues& values) {
  OptimizationOptions p;
  p.max_epoch = values.non_negative("max-epoch");
  p.max_update = values.non_negative("max-update");
  p.clip_norm = values.number("clip-norm");
  p.update_freq = parse_int_list("--update-freq", values.text("update-freq"));
  p.lr = parse_double_list("--lr", values.text("lr"));
  p.min_lr = values.number("min-lr");
  p.validate();
  const optim::CommonOptimOptions common = optim::read_common_optim_options(values, p.lr);
  p.optimizer = values.text("optimizer");
  p.make_optimizer = optim::optimizers().get(p.optimizer).configure(values, common);
  p.lr_scheduler = values.text("lr_scheduler");
  p.make_lr_scheduler = optim::lr_schedulers().get(p.lr_scheduler).configure(values, common);
  // A malformed value is an error even for a flag of another optimizer or schedule than the one chosen.
  for (const auto& name : optim::optimizers().names()) optim::optimizers().get(name).configure(values, common);
  for (const auto& name : optim::lr_schedulers().names()) optim::lr_schedulers().get(name).configure(values, common);
  return p;
}

}  // namespace hetseq
