#include "hetseq/optim/optimizer_overrides.h"

#include <regex>
#include <set>

#include "hetseq/core/error.h"
#include "hetseq/core/format.h"
#include "hetseq/core/parse.h"

namespace hetseq {

namespace {
constexpr const char* kFlag = "--optimizer-overrides";
}  // namespace

std::vector<std::pair<std::string, double>> parse_optimizer_overrides(const std::string& text) {
  std::vector<std::pair<std::string, double>> out;
  if (text.empty()) return out;
  static const std::regex kName("[A-Za-z_][A-Za-z0-9_]*");
  std::set<std::string> seen;
  size_t start = 0;
  while (true) {
    const size_t comma = text.find(',', start);
    const std::string item = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    const size_t eq = item.find('=');
    if (eq == std::string::npos) {
      throw UsageError(fmt::format("{}: '{}' is not key=value (e.g. beta2=0.98,weight_decay=0.01)", kFlag, item));
    }
    const std::string name = item.substr(0, eq);
    if (!std::regex_match(name, kName)) {
      throw UsageError(fmt::format("{}: '{}' is not a hyper-parameter name (letters, digits, '_')", kFlag, name));
    }
    if (!seen.insert(name).second) throw UsageError(fmt::format("{}: '{}' is given twice", kFlag, name));
    out.emplace_back(name, parse_double(fmt::format("{} {}", kFlag, name), item.substr(eq + 1)));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

void apply_optimizer_overrides(optim::Optimizer& optimizer, const std::vector<std::pair<std::string, double>>& overrides) {
  for (const auto& [name, value] : overrides) {
    try {
      optimizer.set_hyperparameter(name, value);
    } catch (const UsageError& e) {
      throw UsageError(fmt::format("{} {}={}: {}", kFlag, name, value, e.what()));
    }
  }
}

}  // namespace hetseq
