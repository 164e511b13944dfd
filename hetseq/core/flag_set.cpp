#include "hetseq/core/flag_set.h"

#include "hetseq/core/error.h"
#include "hetseq/core/format.h"
#include "hetseq/core/parse.h"

namespace hetseq {

FlagSet& FlagSet::add(const std::string& name, const std::string& help, const std::string& default_text,
                      const std::string& value_name) {
  flags_.push_back(FlagSpec{name, help, default_text, value_name, false});
  return *this;
}

FlagSet& FlagSet::add_optional(const std::string& name, const std::string& help, const std::string& value_name) {
  flags_.push_back(FlagSpec{name, help, std::nullopt, value_name, false});
  return *this;
}

FlagSet& FlagSet::add_switch(const std::string& name, const std::string& help) {
  flags_.push_back(FlagSpec{name, help, std::string("false"), "", true});
  return *this;
}

const std::string& FlagValues::text(const std::string& name) const {
  auto it = texts_.find(name);
  if (it == texts_.end()) throw UsageError(fmt::format("--{} is required (see --help)", name));
  return it->second;
}

std::string FlagValues::text_or(const std::string& name, const std::string& fallback) const {
  auto it = texts_.find(name);
  return it == texts_.end() ? fallback : it->second;
}

int64_t FlagValues::integer(const std::string& name) const { return parse_int("--" + name, text(name)); }

double FlagValues::number(const std::string& name) const { return parse_double("--" + name, text(name)); }

bool FlagValues::flag(const std::string& name) const { return text_or(name, "false") == "true"; }

}  // namespace hetseq
