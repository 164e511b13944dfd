#pragma once
/// Flags declared where they are used, without a command-line library in sight: a FlagSet lists a
/// component's flags (a task's, for instance) with their help and defaults; the driver (hetseq/cli/)
/// puts them into its parser and hands back FlagValues, the texts given or defaulted, which the
/// component reads with strict parsing. So one flag lives in one place, and public headers name no
/// parser.

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace hetseq {

/// One declared flag.
struct FlagSpec {
  std::string name;                         // long name without dashes: "hidden" is --hidden
  std::string help;                         // one line for --help
  std::optional<std::string> default_text;  // as written on a command line ("32", "0.25,0.5"); none: unset
  std::string value_name = "VALUE";         // shown as --name VALUE
  bool is_switch = false;                   // takes no value; "true" when given, else its default_text
  std::string short_name;                   // one letter ("h" is -h), or empty
  bool per_rank = false;                    // ranks may differ in it: not compared at start (Note [Compared flags])
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
  /// --name, a switch: `on` unless given (given, it is true; --name=false turns a default of true off).
  FlagSet& add_switch(const std::string& name, const std::string& help, bool on = false);
  /// Gives the flag declared last a one-letter name as well (-h for --help).
  FlagSet& short_name(const std::string& letter);
  /// Marks the flag declared last as one whose value may differ from rank to rank (a batch size, a device,
  /// a path, how a rank logs); every other flag is compared across the ranks at start (Note [Compared
  /// flags]). Add it only where ranks may legitimately differ.
  FlagSet& per_rank();

  /// The flags of this set named in `names`, in this set's order, shown under `group`: how a program
  /// reuses a part of a component's declarations (hetseq-eval the batch flags of hetseq-train). A name
  /// this set does not declare is an InternalError.
  FlagSet subset(const std::string& group, const std::vector<std::string>& names) const;

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
  /// `texts` [flag name without dashes] its text; an unset flag is absent. `given`: the names given on
  /// the command line (the others have their default).
  explicit FlagValues(std::map<std::string, std::string> texts, std::set<std::string> given = {})
      : texts_(std::move(texts)), given_(std::move(given)) {}

  /// Whether --name has a value (given, or a default).
  bool has(const std::string& name) const { return texts_.count(name) > 0; }
  /// Whether --name was given on the command line (a default, the flag's or the task's, is not).
  bool given(const std::string& name) const { return given_.count(name) > 0; }
  /// The text of --name; UsageError "--name is required" when unset.
  const std::string& text(const std::string& name) const;
  /// The text of --name, or `fallback` when unset.
  std::string text_or(const std::string& name, const std::string& fallback) const;
  /// --name as an integer (all of the text; "12x" is an error).
  int64_t integer(const std::string& name) const;
  /// --name as an integer of at least 1 ("--name: 0 must be a positive integer" otherwise).
  int64_t positive(const std::string& name) const;
  /// --name as an integer of at least 0 ("--name: -1 is negative; it must be 0 or more" otherwise).
  int64_t non_negative(const std::string& name) const;
  /// --name as a number.
  double number(const std::string& name) const;
  /// A switch: whether --name was given.
  bool flag(const std::string& name) const;

  const std::map<std::string, std::string>& texts() const { return texts_; }

 private:
  std::map<std::string, std::string> texts_;  // [flag name]
  std::set<std::string> given_;               // flag names given on the command line
};

}  // namespace hetseq
