#include "hetseq/session/balance_flags.h"

#include "hetseq/core/error.h"
#include "hetseq/core/flag_text.h"
#include "hetseq/core/parse.h"

namespace hetseq {

void declare_balance_flags(FlagSet& flags, const AutoBalanceOptions& d) {
  flags.add_switch("auto-balance", "move each update's samples between ranks so that all finish their compute "
                   "together; the samples per update (and so the training) stay what --max-sentences and "
                   "--update-freq make them", d.auto_balance)
      .add("balance-interval", "updates between two re-plans of the split", flag_text(d.interval))
      .add("balance-threshold", "apply a new split only when it is predicted faster by more than this share of the "
           "step time (default 0.03, widened to twice the measured noise; a value given is used as is)",
           flag_text(d.threshold));
  const std::string cap_help = "largest micro-batch a worker may run when balancing (memory); a larger share runs as "
                               "several micro-batches. A comma list gives one per local worker (default: no limit)";
  if (d.caps.empty()) {
    flags.add_optional("balance-cap", cap_help).per_rank();
  } else {
    flags.add("balance-cap", cap_help, flag_text(d.caps)).per_rank();
  }
}

AutoBalanceOptions read_balance_options(const FlagValues& values) {
  AutoBalanceOptions b;
  b.auto_balance = values.flag("auto-balance");
  b.interval = values.positive("balance-interval");
  b.threshold = values.number("balance-threshold");
  b.threshold_given = values.given("balance-threshold");
  if (b.threshold < 0 || b.threshold >= 1) {
    throw UsageError(fmt::format("--balance-threshold: {} must be at least 0 and below 1 (a share of the step time)",
                                 b.threshold));
  }
  if (values.has("balance-cap")) {
    b.caps = parse_int_list("--balance-cap", values.text("balance-cap"));
    for (int64_t c : b.caps) {
      if (c <= 0) throw UsageError(fmt::format("--balance-cap: {} must be a positive number of samples", c));
    }
  }
  return b;
}

}  // namespace hetseq
