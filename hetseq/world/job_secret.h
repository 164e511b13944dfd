#pragma once
// A job's secret (--distributed-secret-file, --make-secret): what every rank of one job holds and no one else does.
// See Note [A job's secret] (job_secret.cpp) and docs/security.md.

#include <array>
#include <cstdint>
#include <string>

namespace hetseq {

/// The environment variable that names the secret file where --distributed-secret-file is not given (torchrun,
/// Slurm: one export reaches every rank).
inline constexpr const char* kSecretFileEnv = "HETSEQ_SECRET_FILE";

/// 32 random bytes, kept as 64 hexadecimal digits in a file that its owner alone may read.
class JobSecret {
 public:
  /// Reads the secret in `path`. Throws hetseq::UsageError naming the file (and `flag`, the option that named
  /// it) when it is missing, unreadable, readable by its group or others, or not a secret of --make-secret.
  static JobSecret load(const std::string& path, const std::string& flag);
  /// Writes a new secret to `path`, mode 0600, never over an existing file (hetseq::UsageError naming it).
  static void make(const std::string& path);

  const std::string& path() const { return path_; }
  /// How the rank was given it, for a message: "--distributed-secret-file PATH" or "HETSEQ_SECRET_FILE=PATH".
  const std::string& source() const { return source_; }
  /// A 32-byte key for `purpose` derived from the secret: HMAC-SHA256(secret, "hetseq/" + purpose). Keys of
  /// different purposes are unrelated, so the store's key says nothing of the one TLS uses.
  std::array<uint8_t, 32> derive(const std::string& purpose) const;

 private:
  std::string path_;
  std::string source_;
  std::array<uint8_t, 32> bytes_{};
};

}  // namespace hetseq
