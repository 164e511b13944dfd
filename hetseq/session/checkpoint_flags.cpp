#include "hetseq/session/checkpoint_flags.h"

#include "hetseq/checkpoint/save_flags.h"
#include "hetseq/core/error.h"
#include "hetseq/core/flag_text.h"
#include "hetseq/optim/optimizer_overrides.h"

namespace hetseq {

void declare_checkpoint_flags(FlagSet& flags, const CheckpointOptions& d) {
  declare_save_flags(flags, d.save);
  std::vector<std::string> overrides;  // key=value
  for (const auto& [key, value] : d.optimizer_overrides) overrides.push_back(fmt::format("{}={}", key, value));
  flags.add("restore-file", "checkpoint to resume from: a file name in --save-dir, or a path", d.restore_file)
      .per_rank()
      .add_switch("reset-dataloader", "on resume, start at the first sample of epoch 1 (keep the update count)",
                  d.reset_dataloader)
      .add_switch("reset-lr-scheduler", "on resume, don't load the learning rate scheduler state", d.reset_lr_scheduler)
      .add_switch("reset-meters", "on resume, don't load the meters", d.reset_meters)
      .add_switch("reset-optimizer", "on resume, don't load the optimizer state, hyper-parameters or loss scale",
                  d.reset_optimizer)
      .add("optimizer-overrides", "on resume, optimizer hyper-parameters to change: key=value,... (e.g. beta2=0.98)",
           flag_text(overrides));
  const std::string dump_help = "debugging: each rank appends the sample indices of every update to "
                                "DIR/samples-rankR.txt";
  if (d.dump_sample_ids) {
    flags.add("dump-sample-ids", dump_help, *d.dump_sample_ids).per_rank();
  } else {
    flags.add_optional("dump-sample-ids", dump_help).per_rank();
  }
}

CheckpointOptions read_checkpoint_options(const FlagValues& values) {
  CheckpointOptions k;
  k.save = read_save_options(values);
  k.restore_file = values.text("restore-file");
  if (k.restore_file.empty()) throw UsageError("--restore-file: empty path");
  k.restore_file_given = values.given("restore-file");
  k.reset_dataloader = values.flag("reset-dataloader");
  k.reset_lr_scheduler = values.flag("reset-lr-scheduler");
  k.reset_meters = values.flag("reset-meters");
  k.reset_optimizer = values.flag("reset-optimizer");
  k.optimizer_overrides = parse_optimizer_overrides(values.text("optimizer-overrides"));
  if (values.has("dump-sample-ids")) k.dump_sample_ids = values.text("dump-sample-ids");
  return k;
}

}  // namespace hetseq
