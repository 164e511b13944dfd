#pragma once
// The rendezvous store with every value sealed by the job's key: Note [Sealed store] (sealed_store.cpp).

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/Store.hpp>

namespace hetseq {

/// A c10d::Store in front of another (a TCPStore, a FileStore) whose values it seals with AES-256-GCM under
/// `key`, the key's name bound in: a value that was not sealed so (written by a process without the job's
/// secret, or by a rank given another secret file) is never returned; get() throws hetseq::UsageError naming the
/// key and `secret_source` (JobSecret::source(): the flag or variable and the file). Counters (add) are sealed values too, updated by compare-and-set. Everything that
/// reads the store through it (the rendezvous, the handshake, Gloo's exchange of addresses, the save fence, the
/// beats) reads only what the job wrote.
class SealedStore final : public c10d::Store {
 public:
  SealedStore(c10::intrusive_ptr<c10d::Store> inner, const std::array<uint8_t, 32>& key, std::string secret_source);

  c10::intrusive_ptr<c10d::Store> clone() override;
  using c10d::Store::set;
  void set(const std::string& key, const std::vector<uint8_t>& value) override;
  std::vector<uint8_t> compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                  const std::vector<uint8_t>& desired) override;
  std::vector<uint8_t> get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t value) override;
  bool deleteKey(const std::string& key) override;
  bool check(const std::vector<std::string>& keys) override;
  int64_t getNumKeys() override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;
  const std::chrono::milliseconds& getTimeout() const noexcept override;
  void setTimeout(const std::chrono::milliseconds& timeout) override;
  void append(const std::string& key, const std::vector<uint8_t>& value) override;
  std::vector<std::vector<uint8_t>> multiGet(const std::vector<std::string>& keys) override;
  void multiSet(const std::vector<std::string>& keys, const std::vector<std::vector<uint8_t>>& values) override;
  bool hasExtendedApi() const override { return false; }

  /// `plain` sealed for `key` (exposed for the tests: a sealed value is what a rank with the key writes).
  std::vector<uint8_t> seal(const std::string& key, const std::vector<uint8_t>& plain) const;
  /// The value that `sealed` holds for `key`, or a UsageError when it was not sealed with this key for it.
  std::vector<uint8_t> open(const std::string& key, const std::vector<uint8_t>& sealed) const;
  /// Whether `value` begins as a sealed value does (whoever's key sealed it): a rank without a secret reading a
  /// sealed store can say so.
  static bool looks_sealed(const std::vector<uint8_t>& value);

 private:
  /// The next plain value of a key from its current one (none: absent); none: leave it.
  using Change = std::function<std::optional<std::vector<uint8_t>>(const std::optional<std::vector<uint8_t>>&)>;
  /// Compare-and-set over sealed values until `change`'s value goes in unraced (Note [Sealed store], "Counters");
  /// returns the value the key holds after (none: absent).
  std::optional<std::vector<uint8_t>> update(const std::string& key, const Change& change);

  c10::intrusive_ptr<c10d::Store> inner_;
  std::array<uint8_t, 32> key_;
  std::string secret_source_;
};

}  // namespace hetseq
