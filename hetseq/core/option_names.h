#pragma once
/// The words a component's messages use for its options: hetseq-train's flag, or the keyword of the Python
/// package that sets the same option. See Note [Options in the user's words].

#include <string>

#include "hetseq/core/format.h"

namespace hetseq {

// Note [Options in the user's words]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The reducer, the data plan and the shard plan serve hetseq-train and the Python package alike, and their
// errors and log lines tell the user which option to change. A user of hetseq-train wrote
// `--shared-memory-reduce on`; a user of hetseq.DistributedDataParallel wrote `shared_memory="on"` and has
// never seen the flag. So an options struct carries a Naming, set by whoever fills it (the flag readers leave
// the default, kFlags; the Python bindings set kPython), and each option that a message names has one
// OptionName, declared beside the struct's field, with both of its names. A message asks it for the name in
// the caller's words. Advice that has no counterpart in the other front end (--find-unused-parameters,
// --debug-collectives, --reset-dataloader) is a branch on the Naming at that message.
// The names are passed in rather than the text rewritten at the binding: a rewrite would have to find every
// spelling of every flag in every message, and a message that it missed would name the flag unnoticed.

/// Whose words a component's messages use for its options.
enum class Naming {
  kFlags,   // hetseq-train's flags: --shared-memory-reduce on (the default: the command line and hetseq::train)
  kPython,  // the keywords of the hetseq Python package: shared_memory="on"
};

/// One option's names in both front ends (Note [Options in the user's words]).
struct OptionName {
  const char* flag;     // hetseq-train's flag: "--shared-memory-reduce"
  const char* keyword;  // the Python keyword: "shared_memory"
  bool text = false;    // the Python value is a str, written quoted: shared_memory="on"

  /// The option alone: "--shared-memory-reduce" or "shared_memory".
  std::string name(Naming naming) const { return naming == Naming::kPython ? keyword : flag; }
  /// One of its values alone: `on` or `"on"`.
  std::string value(Naming naming, const std::string& v) const {
    return naming == Naming::kPython && text ? fmt::format("\"{}\"", v) : v;
  }
  /// The option set to a value: `--shared-memory-reduce on` or `shared_memory="on"`.
  std::string set_to(Naming naming, const std::string& v) const {
    return naming == Naming::kPython ? fmt::format("{}={}", keyword, value(naming, v)) : fmt::format("{} {}", flag, v);
  }
};

}  // namespace hetseq
