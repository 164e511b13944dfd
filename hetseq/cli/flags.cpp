#include "hetseq/cli/flags.h"

#include "hetseq/core/parse.h"

namespace hetseq {

DefaultOf defaults_from(std::map<std::string, std::string> defaults) {
  return [defaults = std::move(defaults)](const std::string& name) -> std::optional<std::string> {
    auto it = defaults.find(name);
    if (it == defaults.end()) return std::nullopt;
    return it->second;
  };
}

std::shared_ptr<cxxopts::Value> text_flag(const DefaultOf& default_of, const std::string& name,
                                          const std::string& general) {
  return cxxopts::value<std::string>()->default_value(default_of(name).value_or(general));
}

std::shared_ptr<cxxopts::Value> optional_flag(const DefaultOf& default_of, const std::string& name) {
  auto value = cxxopts::value<std::string>();
  if (const auto d = default_of(name)) value->default_value(*d);
  return value;
}

std::shared_ptr<cxxopts::Value> switch_flag() { return cxxopts::value<bool>()->default_value("false"); }

double flag_number(const cxxopts::ParseResult& args, const std::string& name) {
  return parse_double("--" + name, args[name].as<std::string>());
}

int64_t flag_integer(const cxxopts::ParseResult& args, const std::string& name) {
  return parse_int("--" + name, args[name].as<std::string>());
}

bool flag_set(const cxxopts::ParseResult& args, const std::string& name) {
  return args.count(name) != 0 || args[name].has_default();
}

}  // namespace hetseq
