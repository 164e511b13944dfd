#include "hetseq/optim/common_optim_flags.h"

#include "hetseq/core/flag_text.h"
#include "hetseq/core/format.h"
#include "hetseq/optim/inverse_sqrt.h"

namespace hetseq::optim {

void declare_common_optim_flags(FlagSet& optimization, FlagSet& schedule, const CommonOptimOptions& d) {
  optimization.add("weight-decay", "weight decay (alias --wd): decoupled for adam, L2 for sgd",
                   flag_text(d.weight_decay));
  if (d.force_anneal) {
    schedule.add("force-anneal", "force annealing at this epoch (alias --fa)", flag_text(*d.force_anneal));
  } else {
    schedule.add_optional("force-anneal", "force annealing at this epoch (alias --fa)");
  }
  schedule.add("warmup-updates",
               fmt::format("warm the learning rate up linearly over the first N updates (inverse_sqrt: {} unless "
                           "given)", InverseSqrtOptions{}.warmup_updates),
               flag_text(d.warmup_updates));
}

CommonOptimOptions read_common_optim_options(const FlagValues& values, std::vector<double> lrs) {
  CommonOptimOptions c;
  c.lrs = std::move(lrs);
  c.weight_decay = values.number("weight-decay");
  c.warmup_updates = values.non_negative("warmup-updates");
  if (values.has("force-anneal")) c.force_anneal = values.positive("force-anneal");
  return c;
}

}  // namespace hetseq::optim
