#include "hetseq/core/flag_set.h"

#include <algorithm>

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

FlagSet& FlagSet::add_switch(const std::string& name, const std::string& help, bool on) {
  flags_.push_back(FlagSpec{name, help, std::string(on ? "true" : "false"), "", true});
  return *this;
}

FlagSet& FlagSet::short_name(const std::string& letter) {
  HETSEQ_ASSERT(!flags_.empty() && letter.size() == 1, "FlagSet::short_name needs a flag before it and one letter");
  flags_.back().short_name = letter;
  return *this;
}

FlagSet& FlagSet::per_rank() {
  HETSEQ_ASSERT(!flags_.empty(), "FlagSet::per_rank needs a flag before it");
  flags_.back().per_rank = true;
  return *this;
}

FlagSet FlagSet::subset(const std::string& group, const std::vector<std::string>& names) const {
  FlagSet out(group);
  for (const std::string& name : names) {
    HETSEQ_ASSERT(std::any_of(flags_.begin(), flags_.end(), [&](const FlagSpec& f) { return f.name == name; }),
                  fmt::format("FlagSet '{}' declares no --{}", group_, name));
  }
  for (const FlagSpec& f : flags_) {
    if (std::find(names.begin(), names.end(), f.name) != names.end()) out.flags_.push_back(f);
  }
  return out;
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

int64_t FlagValues::positive(const std::string& name) const {
  const int64_t v = integer(name);
  if (v <= 0) throw UsageError(fmt::format("--{}: {} must be a positive integer", name, v));
  return v;
}

int64_t FlagValues::non_negative(const std::string& name) const {
  const int64_t v = integer(name);
  if (v < 0) throw UsageError(fmt::format("--{}: {} is negative; it must be 0 or more", name, v));
  return v;
}

double FlagValues::number(const std::string& name) const { return parse_double("--" + name, text(name)); }

bool FlagValues::flag(const std::string& name) const { return text_or(name, "false") == "true"; }

}  // namespace hetseq
