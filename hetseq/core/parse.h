#pragma once
/// Strict parsing of command-line values. Every function names the flag in its error, accepts the
/// whole text or nothing (no trailing garbage, no overflow) and never evaluates expressions.

#include <cstdint>
#include <string>
#include <vector>

namespace hetseq {

/// Parses a decimal integer. Throws hetseq::UsageError naming `flag` on anything else.
int64_t parse_int(const std::string& flag, const std::string& text);
/// Parses a finite floating-point number (`1e-3`, `0.25`). Throws hetseq::UsageError naming `flag`.
double parse_double(const std::string& flag, const std::string& text);
/// Parses a list of numbers: `0.9,0.999`, `(0.9, 0.999)` or `[0.9, 0.999]`. Whitespace around items is
/// allowed; empty items are not. Throws hetseq::UsageError naming `flag`.
std::vector<double> parse_double_list(const std::string& flag, const std::string& text);
/// Like parse_double_list, for integers (`--update-freq 1,3,2`, `--max-sentences 64,32`).
std::vector<int64_t> parse_int_list(const std::string& flag, const std::string& text);

}  // namespace hetseq
