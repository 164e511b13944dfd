#include "hetseq/world/sealed_store.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/rand.h>

#include <memory>
#include <optional>

#include "hetseq/core/error.h"
#include "hetseq/core/format.h"

namespace hetseq {

// Note [Sealed store]
// ~~~~~~~~~~~~~~~~~~~
// c10d's TCPStore accepts any connection and checks nothing but a public magic number: whoever reaches its port
// can read every key, write a forged peer address for Gloo's exchange, or claim a rank. Its protocol is not
// hetseq's to change, and the connection cannot be made to prove anything through c10d's Store interface. So the
// proof moves into the values: with a secret (Note [A job's secret]) every value is sealed with AES-256-GCM under
// key_ = derive("store"), the store's key name as additional data, as
//   "hsq1" | nonce (12 random bytes) | ciphertext | tag (16 bytes).
// A reader opens it or refuses it: GCM's tag check is OpenSSL's, in constant time. So a process without the
// secret can read names and lengths but no value (peer addresses, the generation, checkpoints' fence states),
// cannot write a value any rank accepts (a forged address or claim is refused with one line naming the key and
// the secret file: exit 2), and cannot move a value to another key (the name is bound in). What it can still do
// is delete keys, add keys that no one reads, or make the run fail by writing garbage: the rendezvous fails with
// that line, or waits out --rendezvous-timeout, never uses what it wrote. A rank given another secret file fails
// the same way on the first value it reads (rank 0's generation) and names its file.
//
// Counters. c10d's add() keeps a plain decimal number on the server, which anyone could change. Here add() is a
// compare-and-set loop over a sealed number: read (or none), open, add, seal with a fresh nonce, compareSet; a
// writer that raced it makes the compare fail and the loop read again. A fresh nonce makes each sealed value
// unique, so the returned bytes say whether this writer's value went in.
//
// Without a secret none of this runs: the store is c10d's, unchanged, and the run is bit for bit today's.

namespace {

constexpr char kMagic[4] = {'h', 's', 'q', '1'};
constexpr size_t kNonce = 12;
constexpr size_t kTag = 16;

struct CipherDeleter {
  void operator()(EVP_CIPHER_CTX* c) const { EVP_CIPHER_CTX_free(c); }
};
using Cipher = std::unique_ptr<EVP_CIPHER_CTX, CipherDeleter>;

std::vector<uint8_t> bytes_of(int64_t n) {
  const std::string s = std::to_string(n);
  return {s.begin(), s.end()};
}

}  // namespace

SealedStore::SealedStore(c10::intrusive_ptr<c10d::Store> inner, const std::array<uint8_t, 32>& key,
                         std::string secret_source)
    : Store(inner->getTimeout()), inner_(std::move(inner)), key_(key), secret_source_(std::move(secret_source)) {}

c10::intrusive_ptr<c10d::Store> SealedStore::clone() {
  return c10::make_intrusive<SealedStore>(inner_->clone(), key_, secret_source_);
}

std::vector<uint8_t> SealedStore::seal(const std::string& key, const std::vector<uint8_t>& plain) const {
  std::vector<uint8_t> out(sizeof(kMagic) + kNonce + plain.size() + kTag);
  std::copy(kMagic, kMagic + sizeof(kMagic), out.begin());
  uint8_t* nonce = out.data() + sizeof(kMagic);
  uint8_t* body = nonce + kNonce;
  if (RAND_bytes(nonce, static_cast<int>(kNonce)) != 1) throw InternalError("the sealed store: the random source failed");
  Cipher c(EVP_CIPHER_CTX_new());
  int n = 0;
  bool ok = c && EVP_EncryptInit_ex(c.get(), EVP_aes_256_gcm(), nullptr, nullptr, nullptr) == 1 &&
            EVP_CIPHER_CTX_ctrl(c.get(), EVP_CTRL_GCM_SET_IVLEN, static_cast<int>(kNonce), nullptr) == 1 &&
            EVP_EncryptInit_ex(c.get(), nullptr, nullptr, key_.data(), nonce) == 1 &&
            EVP_EncryptUpdate(c.get(), nullptr, &n, reinterpret_cast<const uint8_t*>(key.data()),
                              static_cast<int>(key.size())) == 1;
  if (ok && !plain.empty()) ok = EVP_EncryptUpdate(c.get(), body, &n, plain.data(), static_cast<int>(plain.size())) == 1;
  ok = ok && EVP_EncryptFinal_ex(c.get(), body + plain.size(), &n) == 1 &&
       EVP_CIPHER_CTX_ctrl(c.get(), EVP_CTRL_GCM_GET_TAG, static_cast<int>(kTag), body + plain.size()) == 1;
  if (!ok) throw InternalError(fmt::format("the sealed store: AES-256-GCM failed to seal the value of '{}'", key));
  return out;
}

std::vector<uint8_t> SealedStore::open(const std::string& key, const std::vector<uint8_t>& sealed) const {
  auto refuse = [&](const char* why) {
    return UsageError(fmt::format(
        "the rendezvous store holds a value under '{}' that was not sealed with this job's secret ({}; "
        "{}): this rank's secret file differs from rank 0's, or a process without the "
        "job's secret wrote to the store; give every rank the same secret file",
        key, why, secret_source_));
  };
  if (sealed.size() < sizeof(kMagic) + kNonce + kTag || !looks_sealed(sealed)) {
    throw refuse("not a sealed value");
  }
  const uint8_t* nonce = sealed.data() + sizeof(kMagic);
  const uint8_t* body = nonce + kNonce;
  const size_t length = sealed.size() - sizeof(kMagic) - kNonce - kTag;
  std::vector<uint8_t> plain(length);
  std::vector<uint8_t> tag(body + length, body + length + kTag);
  Cipher c(EVP_CIPHER_CTX_new());
  int n = 0;
  bool ok = c && EVP_DecryptInit_ex(c.get(), EVP_aes_256_gcm(), nullptr, nullptr, nullptr) == 1 &&
            EVP_CIPHER_CTX_ctrl(c.get(), EVP_CTRL_GCM_SET_IVLEN, static_cast<int>(kNonce), nullptr) == 1 &&
            EVP_DecryptInit_ex(c.get(), nullptr, nullptr, key_.data(), nonce) == 1 &&
            EVP_DecryptUpdate(c.get(), nullptr, &n, reinterpret_cast<const uint8_t*>(key.data()),
                              static_cast<int>(key.size())) == 1;
  if (ok && length > 0) ok = EVP_DecryptUpdate(c.get(), plain.data(), &n, body, static_cast<int>(length)) == 1;
  ok = ok && EVP_CIPHER_CTX_ctrl(c.get(), EVP_CTRL_GCM_SET_TAG, static_cast<int>(kTag), tag.data()) == 1 &&
       EVP_DecryptFinal_ex(c.get(), plain.data() + length, &n) == 1;  // the tag's check, in constant time
  if (!ok) throw refuse("its seal does not verify");
  return plain;
}

bool SealedStore::looks_sealed(const std::vector<uint8_t>& value) {
  return value.size() >= sizeof(kMagic) && std::equal(kMagic, kMagic + sizeof(kMagic), value.begin());
}

void SealedStore::set(const std::string& key, const std::vector<uint8_t>& value) { inner_->set(key, seal(key, value)); }

std::optional<std::vector<uint8_t>> SealedStore::update(const std::string& key, const Change& change) {
  for (;;) {
    std::optional<std::vector<uint8_t>> current;  // opened; none: the key is absent
    std::vector<uint8_t> current_sealed;
    if (inner_->check({key})) {
      current_sealed = inner_->get(key);
      current = open(key, current_sealed);
    }
    std::optional<std::vector<uint8_t>> next = change(current);
    if (!next) return current;
    // A fresh nonce makes the sealed bytes unique: the store hands them back only if they went in.
    const std::vector<uint8_t> sealed = seal(key, *next);
    if (inner_->compareSet(key, current_sealed, sealed) == sealed) return next;
  }
}

std::vector<uint8_t> SealedStore::compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                             const std::vector<uint8_t>& desired) {
  // c10d's answer: `desired` when it went in, else the current value (`expected` when the key is absent).
  const auto after = update(key, [&](const std::optional<std::vector<uint8_t>>& current)
                                     -> std::optional<std::vector<uint8_t>> {
    if (current ? *current != expected : !expected.empty()) return std::nullopt;
    return desired;
  });
  return after ? *after : expected;
}

std::vector<uint8_t> SealedStore::get(const std::string& key) { return open(key, inner_->get(key)); }

int64_t SealedStore::add(const std::string& key, int64_t value) {
  int64_t sum = 0;
  update(key, [&](const std::optional<std::vector<uint8_t>>& current) -> std::optional<std::vector<uint8_t>> {
    sum = value;
    if (current) {
      try {
        sum += std::stoll(std::string(current->begin(), current->end()));
      } catch (const std::exception&) {
        throw UsageError(fmt::format("the rendezvous store's counter '{}' holds no number", key));
      }
    }
    return bytes_of(sum);
  });
  return sum;
}

bool SealedStore::deleteKey(const std::string& key) { return inner_->deleteKey(key); }
bool SealedStore::check(const std::vector<std::string>& keys) { return inner_->check(keys); }
int64_t SealedStore::getNumKeys() { return inner_->getNumKeys(); }
void SealedStore::wait(const std::vector<std::string>& keys) { inner_->wait(keys); }
void SealedStore::wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) {
  inner_->wait(keys, timeout);
}
const std::chrono::milliseconds& SealedStore::getTimeout() const noexcept { return inner_->getTimeout(); }
void SealedStore::setTimeout(const std::chrono::milliseconds& timeout) {
  Store::setTimeout(timeout);
  inner_->setTimeout(timeout);
}

void SealedStore::append(const std::string& key, const std::vector<uint8_t>& value) {
  update(key, [&](const std::optional<std::vector<uint8_t>>& current) -> std::optional<std::vector<uint8_t>> {
    std::vector<uint8_t> next = current.value_or(std::vector<uint8_t>{});
    next.insert(next.end(), value.begin(), value.end());
    return next;
  });
}

std::vector<std::vector<uint8_t>> SealedStore::multiGet(const std::vector<std::string>& keys) {
  std::vector<std::vector<uint8_t>> out;
  for (const auto& k : keys) out.push_back(get(k));
  return out;
}

void SealedStore::multiSet(const std::vector<std::string>& keys, const std::vector<std::vector<uint8_t>>& values) {
  for (size_t i = 0; i < keys.size(); ++i) set(keys[i], values[i]);
}

}  // namespace hetseq
