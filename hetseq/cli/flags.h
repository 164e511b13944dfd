#pragma once
/// The defaults that a --task sets for general flags (TaskSpec::defaults), as the drivers put them into
/// their parser in place of the declared ones (add_flag_set, hetseq/cli/train_options.h).

#include <functional>
#include <map>
#include <optional>
#include <string>

namespace hetseq {

/// The default that the --task being run sets for flag `name` (TaskSpec::defaults), if any.
using DefaultOf = std::function<std::optional<std::string>(const std::string& name)>;

/// The DefaultOf that looks `name` up in `defaults`.
DefaultOf defaults_from(std::map<std::string, std::string> defaults);

}  // namespace hetseq
