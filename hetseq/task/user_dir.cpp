#include "hetseq/task/user_dir.h"

#include <dlfcn.h>

#include <algorithm>
#include <filesystem>
#include <set>

#include "hetseq/core/error.h"
#include "hetseq/core/format.h"
#include "hetseq/core/logging.h"
#include "hetseq/task/task_registry.h"
#include "hetseq/version.h"

namespace hetseq {
namespace {

namespace fs = std::filesystem;

// The shared libraries that `path` names: itself, or the `*.so` files of the folder, in name order.
std::vector<fs::path> plugin_files(const std::string& path) {
  std::error_code ec;
  const fs::path p(path);
  if (!fs::exists(p, ec)) {
    throw UsageError(fmt::format("--user-dir {}: no such file or folder; give a task library (lib<task>.so) built "
                                 "against hetseq, or the folder that holds it",
                                 path));
  }
  if (!fs::is_directory(p, ec)) return {p};
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(p, ec)) {
    if (entry.is_regular_file(ec) && entry.path().extension() == ".so") files.push_back(entry.path());
  }
  if (files.empty()) {
    throw UsageError(fmt::format("--user-dir {}: the folder holds no shared library (*.so); build the task as a "
                                 "MODULE library linking hetseq::hetseq (see docs/API.md)",
                                 path));
  }
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace

std::vector<std::string> load_user_dir(const std::string& path) {
  std::vector<std::string> added;
  for (const fs::path& file : plugin_files(path)) {
    const std::vector<std::string> before = TaskRegistry::global().names();
    void* handle = dlopen(fs::absolute(file).c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      const char* reason = dlerror();
      throw InputError(fmt::format("--user-dir {}: cannot load {}: {}; build it against this hetseq ({})", path,
                                   file.string(), reason ? reason : "unknown reason", version()));
    }
    // A registration that failed while the library loaded (Note: nothing throws out of dlopen).
    const std::vector<std::string> errors = TaskRegistry::global().take_registration_errors();
    if (!errors.empty()) {
      throw InputError(fmt::format("--user-dir {}: {} could not register its task: {}; rename the task (--task "
                                   "names must be unique; known: {})",
                                   path, file.string(), errors.front(), fmt::join(before, ", ")));
    }
    const std::set<std::string> known(before.begin(), before.end());
    for (const auto& name : TaskRegistry::global().names()) {
      if (!known.count(name)) added.push_back(name);
    }
    log::info("[tasks] --user-dir: loaded {}", file.string());
  }
  return added;
}

}  // namespace hetseq
