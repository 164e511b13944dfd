#pragma once
/// Flags declared where they are used, without a command-line library in sight: a FlagSet lists a
/// component's flags (a task's, for instance) with their help and defaults; the driver (hetseq/cli/)
/// puts them into its parser and hands back FlagValues, the texts given or defaulted, which the
/// component reads with strict parsing. So one flag lives in one place, and public headers name no
/// parser.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace hetseq {

/// One declared flag.
struct FlagSpec {
  std::string name;                         // long name without dashes: "hidden" is --hidden
  std::string help;                         // one line for --help
  std::optional<std::string> default_text;  // as written on a command line ("32", "0.25,0.5"); none: unset
  std::string value_name = "VALUE";         // shown as --name VALUE
  bool is_switch = false;                   // takes no value; "true" when given, else "false"
};

/// The flags of one component, shown together in --help under `group`.
class FlagSet {
 public:
  explicit FlagSet(std::string group) : group_(std::move(group)) {}

  /// --name VALUE with a default, written as on a command line. Returns *this, so declarations chain.
  FlagSet& add(const std::string& name, const std::string& help, const std::string& default_text,
               const std::string& value_name = "VALUE");
  /// --name VALUE without a default: unset unless given (FlagValues::has).
  FlagSet& add_optional(const std::string& name, const std::string& help, const std::string& value_name = "VALUE");
  /// --name, a switch: false unless given.
  FlagSet& add_switch(const std::string& name, const std::string& help);

  const std::string& group() const { return group_; }
  const std::vector<FlagSpec>& flags() const { return flags_; }

 private:
  std::string group_;
  std::vector<FlagSpec> flags_;
};

/// Flag values by name, as text (given on the command line, or the default), read with strict parsing:
/// a value that does not parse, or a required flag that is unset, is a hetseq::UsageError naming the
/// flag. The driver fills it with every flag it knows, general and the component's own.
class FlagValues {
 public:
  FlagValues() = default;
  /// `texts` [flag name without dashes] its text; an unset flag is absent.
  explicit FlagValues(std::map<std::string, std::string> texts) : texts_(std::move(texts)) {}

  /// Whether --name has a value (given, or a default).
  bool has(const std::string& name) const { return texts_.count(name) > 0; }
  /// The text of --name; UsageError "--name is required" when unset.
  const std::string& text(const std::string& name) const;
  /// The text of --name, or `fallback` when unset.
  std::string text_or(const std::string& name, const std::string& fallback) const;
  /// --name as an integer (all of the text; "12x" is an error).
  int64_t integer(const std::string& name) const;
  /// --name as a number.
  double number(const std::string& name) const;
  /// A switch: whether --name was given.
  bool flag(const std::string& name) const;

  const std::map<std::string, std::string>& texts() const { return texts_; }

 private:
  std::map<std::string, std::string> texts_;  // [flag name]
};

}  // namespace hetseq
