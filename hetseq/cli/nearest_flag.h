#pragma once
/// The known flags nearest to one a user mistyped, for the unknown-flag error of hetseq-train and
/// hetseq-eval ("did you mean --max-sentences?"). See Note [Nearest flag] in nearest_flag.cpp.

#include <cstddef>
#include <string>
#include <vector>

namespace hetseq::cli {

/// The edit distance (insertions, deletions, substitutions and swaps of neighbours, one each) between
/// `a` and `b`.
size_t flag_edit_distance(const std::string& a, const std::string& b);

/// The names among `known` (long names without dashes) close enough to `unknown` to be what was meant,
/// nearest first and in `known`'s order among equals; empty when none is close.
std::vector<std::string> nearest_flags(const std::string& unknown, const std::vector<std::string>& known);

}  // namespace hetseq::cli
