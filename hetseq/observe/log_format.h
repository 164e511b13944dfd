#pragma once
/// How statistics are printed (--log-format), apart from the ProgressLogger that prints them.

#include <string>

namespace hetseq {

/// How statistics are printed (--log-format).
enum class LogFormat { kNone, kSimple, kJson };

/// Parses --log-format (`none`, `simple`, `json`); throws hetseq::UsageError otherwise.
LogFormat parse_log_format(const std::string& text);
/// The --log-format spelling of `format`.
std::string to_string(LogFormat format);

}  // namespace hetseq
