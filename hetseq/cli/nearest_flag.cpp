#include "hetseq/cli/nearest_flag.h"

#include <algorithm>
#include <vector>

namespace hetseq::cli {

// Note [Nearest flag]
// ~~~~~~~~~~~~~~~~~~~
// An unknown flag is most often a known one with a letter missing, doubled or swapped (--max-sentence,
// --update-frq, --lr-shceduler). hetseq-train names the known flags at the smallest edit distance
// (optimal string alignment: a swap of neighbours counts one), but only when that distance is small for
// the name's length: at most 1 for names of up to 4 letters, 2 up to 8, 3 beyond, so that a flag of
// another program (--epochs) gets no unrelated suggestion. Equals are all named, in the parser's order.

size_t flag_edit_distance(const std::string& a, const std::string& b) {
  // d[i][j]: the distance between a's first i letters and b's first j.
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1, 0));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  }
  return d[a.size()][b.size()];
}

std::vector<std::string> nearest_flags(const std::string& unknown, const std::vector<std::string>& known) {
  const size_t limit = unknown.size() <= 4 ? 1 : unknown.size() <= 8 ? 2 : 3;  // Note [Nearest flag]
  size_t best = limit + 1;
  std::vector<std::string> out;
  for (const std::string& name : known) {
    const size_t d = flag_edit_distance(unknown, name);
    if (d > best) continue;
    if (d < best) out.clear();
    best = d;
    if (std::find(out.begin(), out.end(), name) == out.end()) out.push_back(name);
  }
  return out;
}

}  // namespace hetseq::cli
