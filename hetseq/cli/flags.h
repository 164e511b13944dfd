#pragma once
/// Declaring and reading command-line flags with cxxopts: defaults that a task may replace, and values
/// parsed strictly with the flag's name in every error. Used wherever a flag is declared (the drivers'
/// groups, the optimizers' and schedules' own files).

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include <cxxopts.hpp>

namespace hetseq {

/// The default that the --task being run sets for flag `name` (TaskSpec::defaults), if any.
using DefaultOf = std::function<std::optional<std::string>(const std::string& name)>;

/// The DefaultOf that looks `name` up in `defaults`.
DefaultOf defaults_from(std::map<std::string, std::string> defaults);

/// A text flag whose default is the task's, else `general`.
std::shared_ptr<cxxopts::Value> text_flag(const DefaultOf& default_of, const std::string& name,
                                          const std::string& general);
/// A text flag without a default unless the task sets one.
std::shared_ptr<cxxopts::Value> optional_flag(const DefaultOf& default_of, const std::string& name);
/// A switch: false unless given.
std::shared_ptr<cxxopts::Value> switch_flag();

/// Reads the value of flag `name` as a number (hetseq::UsageError naming --name otherwise).
double flag_number(const cxxopts::ParseResult& args, const std::string& name);
/// Reads the value of flag `name` as an integer (hetseq::UsageError naming --name otherwise).
int64_t flag_integer(const cxxopts::ParseResult& args, const std::string& name);
/// Whether flag `name` has a value (given, or a default).
bool flag_set(const cxxopts::ParseResult& args, const std::string& name);

}  // namespace hetseq
