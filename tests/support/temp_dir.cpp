#include "support/temp_dir.h"

#include <ftw.h>
#include <stdlib.h>

#include <cstdio>
#include <filesystem>
#include <stdexcept>

namespace hetseq::test {
namespace {

int remove_entry(const char* path, const struct stat*, int, struct FTW*) { return std::remove(path); }

}  // namespace

TempDir::TempDir() {
  std::string pattern = (std::filesystem::temp_directory_path() / "hetseq-test-XXXXXX").string();
  if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed for " + pattern);
  path_ = pattern;
}

// Not std::filesystem::remove_all: libtorch.so of the torch wheel exports its own copy of that
// symbol, which the dynamic linker picks and which crashes.
TempDir::~TempDir() { ::nftw(path_.c_str(), remove_entry, 16, FTW_DEPTH | FTW_PHYS); }

}  // namespace hetseq::test
