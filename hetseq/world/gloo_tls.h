#pragma once
// Gloo over mutual TLS with the job's identity: Note [Gloo over TLS] (gloo_tls.cpp).

#include <memory>
#include <string>

#include "hetseq/world/job_secret.h"

namespace gloo::transport {
class Device;
}

namespace hetseq {

/// The job's TLS identity for Gloo's pairs: an Ed25519 key and a self-signed certificate, both derived from the
/// job's secret (so every rank holds the same ones without a file beside the secret), kept as PEM in anonymous
/// memory files for as long as this object lives.
class GlooTls {
 public:
  /// Derives the key and certificate. Throws hetseq::InternalError when OpenSSL fails.
  explicit GlooTls(const JobSecret& secret);
  ~GlooTls();
  GlooTls(const GlooTls&) = delete;
  GlooTls& operator=(const GlooTls&) = delete;

  /// A Gloo TCP_TLS device on `address` (an address of this machine), or on the network interface `iface` when
  /// `address` is empty: both ends of every pair present the job's certificate and verify the other's.
  std::shared_ptr<::gloo::transport::Device> device(const std::string& address, const std::string& iface) const;

 private:
  int key_fd_ = -1;
  int cert_fd_ = -1;
};

}  // namespace hetseq
