#include "hetseq/checkpoint/model_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>

#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include "hetseq/core/error.h"

namespace hetseq {
namespace fs = std::filesystem;
namespace {

void fsync_path(const fs::path& path, bool directory) {
  const int fd = ::open(path.c_str(), directory ? O_RDONLY | O_DIRECTORY : O_RDONLY);
  if (fd < 0) throw InputError(fmt::format("{}: cannot open to sync: {}", path.string(), std::strerror(errno)));
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0 && !directory) {
    throw InputError(fmt::format("{}: fsync failed: {}", path.string(), std::strerror(errno)));
  }
}

}  // namespace

void ensure_writable_dir(const fs::path& dir, const std::string& flag) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir)) {
    throw InputError(fmt::format("{} {}: cannot create the directory ({}); choose a writable path", flag,
                                 dir.string(), ec ? ec.message() : "a file of that name exists"));
  }
  const fs::path probe = dir / fmt::format(".hetseq-write-test-{}", ::getpid());
  std::FILE* f = std::fopen(probe.c_str(), "wb");
  if (f == nullptr) {
    throw InputError(fmt::format("{} {}: cannot write into the directory ({}); choose a writable path", flag,
                                 dir.string(), std::strerror(errno)));
  }
  std::fclose(f);
  fs::remove(probe, ec);
}

void save_model(const torch::nn::Module& model, const fs::path& path) {
  torch::serialize::OutputArchive archive;
  for (const auto& item : model.named_parameters(/*recurse=*/true)) archive.write(item.key(), item.value());
  for (const auto& item : model.named_buffers(/*recurse=*/true)) archive.write(item.key(), item.value(), /*is_buffer=*/true);
  const fs::path tmp = path.parent_path() / fmt::format(".{}.tmp-{}", path.filename().string(), ::getpid());
  try {
    archive.save_to(tmp.string());
    fsync_path(tmp, /*directory=*/false);
    fs::rename(tmp, path);
    fsync_path(path.parent_path().empty() ? fs::path(".") : path.parent_path(), /*directory=*/true);
  } catch (const std::exception& e) {
    std::error_code ec;
    fs::remove(tmp, ec);
    throw InputError(fmt::format("{}: cannot save the model: {}", path.string(), e.what()));
  }
}

void load_model(torch::nn::Module& model, const fs::path& path) {
  if (!fs::is_regular_file(path)) {
    throw InputError(fmt::format("{}: no such checkpoint file; check the path", path.string()));
  }
  torch::serialize::InputArchive archive;
  try {
    archive.load_from(path.string());
  } catch (const c10::Error& e) {
    throw InputError(fmt::format("{}: not a readable hetseq checkpoint ({})", path.string(), e.what_without_backtrace()));
  }
  torch::NoGradGuard no_grad;
  auto load = [&](const std::string& name, torch::Tensor& target, bool is_buffer) {
    torch::Tensor value;
    if (!archive.try_read(name, value, is_buffer)) {
      throw InputError(fmt::format("{}: has no tensor '{}'; was it saved from another model or task?", path.string(), name));
    }
    if (value.sizes() != target.sizes()) {
      throw InputError(fmt::format("{}: tensor '{}' has shape {} but the model expects {}", path.string(), name,
                                   fmt::join(value.sizes(), "x"), fmt::join(target.sizes(), "x")));
    }
    target.copy_(value);
  };
  for (auto& item : model.named_parameters(true)) load(item.key(), item.value(), false);
  for (auto& item : model.named_buffers(true)) load(item.key(), item.value(), true);
}

}  // namespace hetseq
