#include "hetseq/world/gloo_tls.h"

#include <sys/mman.h>
#include <unistd.h>

#include <openssl/bio.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include "hetseq/core/error.h"
#include "hetseq/core/format.h"
#include "hetseq/world/gloo_tls_pairs.h"
#include "hetseq/world/gloo_tls_transport.h"

namespace hetseq {

// Note [Gloo over TLS]
// ~~~~~~~~~~~~~~~~~~~~
// Gloo's pairs carry the gradients, the broadcasts of the training state and every other collective in clear
// text, and accept any connection that knows the addresses in the store. With a job's secret (Note [A job's
// secret]) and ranks that meet over the network, each Gloo device is the TCP_TLS transport that LibTorch's Gloo
// carries: TLS 1.3 only, both ends present a certificate and verify the other's against the trusted ones
// (SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, chains of depth 1).
//
// The identity is derived, not distributed: the Ed25519 private key is derive("gloo-tls/ed25519") (an Ed25519
// key is any 32 bytes), and the certificate is self-signed with fixed fields (subject and issuer "hetseq job",
// serial 1, valid 2000-9999, CA:TRUE). Ed25519 signatures are deterministic, so every rank builds the same bytes
// from the secret alone; each rank trusts exactly that certificate, so a peer proves it holds the job's key, which
// only the secret gives. Nothing is written beside the secret: the PEM texts live in anonymous memory files
// (memfd_create) that OpenSSL reads by their /proc/self/fd paths whenever Gloo makes a context (every process
// group, the sub-groups of a split included), and that vanish with the process.
//
// When: a secret is given and the ranks do not meet on loopback (the init method's host is not this machine's
// loopback, or file://, whose ranks may be anywhere that shares the filesystem). Every rank of a job decides
// alike, since they share the init method and the secret. Ranks of one machine over 127.0.0.1 keep plain TCP, and
// their gradients go through shared memory (Note [Shared-memory reduction]) as before. NCCL's own sockets are not
// Gloo's and are not covered (docs/security.md).
//
// LibTorch's Gloo would make plain TCP pairs on this device all the same: Note [Gloo's TLS pairs] says why and
// how hetseq makes them TLS pairs, which the GlooTls constructor does before any device exists.

namespace {

template <typename T, void (*Free)(T*)>
struct Deleter {
  void operator()(T* p) const { Free(p); }
};
using Key = std::unique_ptr<EVP_PKEY, Deleter<EVP_PKEY, EVP_PKEY_free>>;
using Cert = std::unique_ptr<X509, Deleter<X509, X509_free>>;
using Bio = std::unique_ptr<BIO, Deleter<BIO, BIO_free_all>>;
using Extension = std::unique_ptr<X509_EXTENSION, Deleter<X509_EXTENSION, X509_EXTENSION_free>>;

void require(bool ok, const char* what) {
  if (!ok) throw InternalError(fmt::format("Gloo over TLS: OpenSSL failed to {}", what));
}

std::string text_of(BIO* bio) {
  char* data = nullptr;
  const long n = BIO_get_mem_data(bio, &data);
  return std::string(data, static_cast<size_t>(n));
}

int memory_file(const char* name, const std::string& text) {
  const int fd = ::memfd_create(name, MFD_CLOEXEC);
  require(fd >= 0, "create a memory file for the job's TLS identity");
  const bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  if (!ok) ::close(fd);
  require(ok, "write the job's TLS identity");
  return fd;
}

std::string path_of(int fd) { return fmt::format("/proc/self/fd/{}", fd); }

}  // namespace

GlooTls::GlooTls(const JobSecret& secret) {
  route_gloo_tls_pairs();  // Note [Gloo's TLS pairs]: without it, the pairs would be plain TCP
  const auto seed = secret.derive("gloo-tls/ed25519");
  Key key(EVP_PKEY_new_raw_private_key(EVP_PKEY_ED25519, nullptr, seed.data(), seed.size()));
  require(key != nullptr, "make the Ed25519 key");
  Cert cert(X509_new());
  require(cert != nullptr && X509_set_version(cert.get(), 2) == 1 &&
              ASN1_INTEGER_set(X509_get_serialNumber(cert.get()), 1) == 1 &&
              ASN1_TIME_set_string(X509_getm_notBefore(cert.get()), "20000101000000Z") == 1 &&
              ASN1_TIME_set_string(X509_getm_notAfter(cert.get()), "99991231235959Z") == 1 &&
              X509_set_pubkey(cert.get(), key.get()) == 1,
          "fill the certificate");
  X509_NAME* name = X509_get_subject_name(cert.get());
  require(X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, reinterpret_cast<const unsigned char*>("hetseq job"),
                                     -1, -1, 0) == 1 &&
              X509_set_issuer_name(cert.get(), name) == 1,
          "name the certificate");
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, cert.get(), cert.get(), nullptr, nullptr, 0);
  for (const auto& [nid, value] : {std::pair<int, const char*>{NID_basic_constraints, "critical,CA:TRUE"},
                                   {NID_key_usage, "critical,digitalSignature,keyCertSign"},
                                   {NID_subject_key_identifier, "hash"}}) {
    Extension ext(X509V3_EXT_conf_nid(nullptr, &ctx, nid, value));
    require(ext != nullptr && X509_add_ext(cert.get(), ext.get(), -1) == 1, "add the certificate's extensions");
  }
  require(X509_sign(cert.get(), key.get(), nullptr) > 0, "sign the certificate");
  Bio key_pem(BIO_new(BIO_s_mem())), cert_pem(BIO_new(BIO_s_mem()));
  require(key_pem && cert_pem &&
              PEM_write_bio_PrivateKey(key_pem.get(), key.get(), nullptr, nullptr, 0, nullptr, nullptr) == 1 &&
              PEM_write_bio_X509(cert_pem.get(), cert.get()) == 1,
          "write the key and certificate as PEM");
  key_fd_ = memory_file("hetseq-gloo-tls-key", text_of(key_pem.get()));
  cert_fd_ = memory_file("hetseq-gloo-tls-cert", text_of(cert_pem.get()));
}

GlooTls::~GlooTls() {
  if (key_fd_ >= 0) ::close(key_fd_);
  if (cert_fd_ >= 0) ::close(cert_fd_);
}

std::shared_ptr<::gloo::transport::Device> GlooTls::device(const std::string& address, const std::string& iface) const {
  ::gloo::transport::tcp::attr attr;
  if (!address.empty()) {
    attr.hostname = address;
  } else {
    attr.iface = iface;
  }
  // The certificate is its own authority: the trusted file is the certificate itself.
  return ::gloo::transport::tcp::tls::CreateDevice(attr, path_of(key_fd_), path_of(cert_fd_), path_of(cert_fd_), "");
}

}  // namespace hetseq
