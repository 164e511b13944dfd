#include "hetseq/reduce/ddp_flags.h"

#include "hetseq/core/flag_text.h"

namespace hetseq {

void declare_ddp_flags(FlagSet& flags, const DdpOptions& d) {
  flags.add("bucket-cap-mb", "gradient bucket size in MB", flag_text(d.bucket_cap_mb))
      .add_switch("find-unused-parameters", "allow models that leave some parameters out of a step",
                  d.find_unused_parameters)
      .add_switch("broadcast-buffers", "broadcast the model's buffers from rank 0 before each update's forward passes "
                  "(--broadcast-buffers=false to keep each rank's own)", d.broadcast_buffers)
      .add("ddp-comm-hook", "how gradient buckets travel: none (float32, exact), fp16 or bf16 (half the bytes, "
           "rounded to the format), powersgd (low-rank, --powersgd-rank)", to_string(d.comm_hook))
      .add("shared-memory-reduce", "auto, on or off: ranks of one machine sum their CPU gradient buckets through "
           "shared memory instead of the process group's loopback TCP (auto: when every rank runs on this machine, "
           "with --ddp-comm-hook none and room in /dev/shm)", to_string(d.shared_memory))
      .add("powersgd-rank", "rank of PowerSGD's approximation of each gradient matrix", flag_text(d.powersgd.rank))
      .add("powersgd-start-update", "updates reduced uncompressed before PowerSGD starts (warm-up)",
           flag_text(d.powersgd.start_update));
}

DdpOptions read_ddp_options(const FlagValues& values) {
  DdpOptions o;
  o.bucket_cap_mb = values.number("bucket-cap-mb");
  o.find_unused_parameters = values.flag("find-unused-parameters");
  o.broadcast_buffers = values.flag("broadcast-buffers");
  o.comm_hook = parse_comm_hook(values.text("ddp-comm-hook"));
  o.shared_memory = parse_shared_memory_reduce(values.text("shared-memory-reduce"));
  o.powersgd.rank = values.integer("powersgd-rank");
  o.powersgd.start_update = values.integer("powersgd-start-update");
  o.validate();
  return o;
}

}  // namespace hetseq
