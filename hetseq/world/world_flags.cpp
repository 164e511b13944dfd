#include "hetseq/world/world_flags.h"

#include "hetseq/core/error.h"
#include "hetseq/core/flag_text.h"

namespace hetseq {

void declare_world_flags(FlagSet& flags, const WorldOptions& d) {
  flags.add_optional("distributed-world-size",
                     "total number of workers across all nodes (default: this node's workers)").per_rank()
      .add("distributed-rank", "global rank of this node's first worker", flag_text(d.rank)).per_rank()
      .add_optional("distributed-backend", "gloo or nccl (default: nccl with CUDA, gloo with --cpu or without CUDA)")
      .per_rank()
      .add_optional("distributed-init-method",
                    "tcp://HOST:PORT, file:///shared/path or env:// (Slurm's variables when unset)").per_rank()
      .add("device-id", "device of this worker (alias --local_rank; set by the launcher)", flag_text(d.device_id))
      .per_rank()
      .add("distributed-timeout", "seconds a collective may wait for a peer before the run fails (a lost peer)",
           flag_text(d.timeout)).per_rank()
      .add_optional("rendezvous-timeout", "seconds to wait for every rank to arrive at the start, and at the end "
                                          "(default: --distributed-timeout)").per_rank()
      .add("checkpoint-timeout", "seconds the other ranks wait for rank 0 to write a checkpoint; they fail sooner, "
           "after --distributed-timeout, only if a rank that writes stops showing progress (it died or hangs)",
           flag_text(d.checkpoint_timeout)).per_rank()
      .add_optional("distributed-secret-file", "the job's secret (hetseq-train --make-secret PATH writes one), the "
                    "same file on every node: seals the rendezvous store and encrypts Gloo between machines "
                    "(docs/security.md; default: $HETSEQ_SECRET_FILE, or none)", "PATH").per_rank()
      .add_optional("make-secret", "write a new job secret to PATH, readable by its owner only, and exit", "PATH")
      .add_switch("debug-collectives", "check every collective across the ranks (operation, sizes, dtypes) before it "
                  "runs, so a mismatch is an error naming the rank instead of a hang; slower", d.debug_collectives);
}

WorldOptions read_world_options(const FlagValues& values) {
  WorldOptions w;
  if (values.has("distributed-world-size")) w.world_size = values.positive("distributed-world-size");
  w.rank = values.non_negative("distributed-rank");
  w.rank_given = values.given("distributed-rank");
  if (values.has("distributed-backend")) {
    w.backend = values.text("distributed-backend");
    if (w.backend != "gloo" && w.backend != "nccl") {
      throw UsageError(fmt::format("--distributed-backend: '{}' is not one of gloo, nccl", w.backend));
    }
  }
  if (values.has("distributed-init-method")) w.init_method = values.text("distributed-init-method");
  w.device_id = values.non_negative("device-id");
  w.timeout = std::chrono::seconds(values.positive("distributed-timeout"));
  w.rendezvous_timeout = values.has("rendezvous-timeout")
                             ? std::chrono::milliseconds(std::chrono::seconds(values.positive("rendezvous-timeout")))
                             : w.timeout;
  w.checkpoint_timeout = std::chrono::seconds(values.positive("checkpoint-timeout"));
  w.debug_collectives = values.flag("debug-collectives");
  if (values.has("distributed-secret-file")) w.secret_file = values.text("distributed-secret-file");
  return w;
}

}  // namespace hetseq
