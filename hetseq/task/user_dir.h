#pragma once
/// Tasks that live outside the tree: `--user-dir PATH` loads shared libraries whose static registration
/// (HETSEQ_REGISTER_TASK) adds tasks to TaskRegistry::global(), as fairseq's --user-dir imports a module.

#include <string>
#include <vector>

namespace hetseq {

/// Loads the task plugin `path`: a shared library, or a folder whose `*.so` files are loaded in name order.
/// Returns the names of the tasks that the loaded libraries registered. A library stays loaded for the
/// life of the process; loading the same file twice registers nothing new. Throws hetseq::UsageError
/// naming --user-dir when `path` does not exist or a folder holds no `*.so`, and hetseq::InputError naming
/// --user-dir and the file with the loader's reason when a library cannot be loaded (a missing symbol,
/// another architecture) or registers a task name that is already taken.
std::vector<std::string> load_user_dir(const std::string& path);

}  // namespace hetseq
