#include "hetseq/cli/flags.h"

namespace hetseq {

DefaultOf defaults_from(std::map<std::string, std::string> defaults) {
  return [defaults = std::move(defaults)](const std::string& name) -> std::optional<std::string> {
    auto it = defaults.find(name);
    if (it == defaults.end()) return std::nullopt;
    return it->second;
  };
}

}  // namespace hetseq
