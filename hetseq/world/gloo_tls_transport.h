#pragma once
// The TCP_TLS transport that LibTorch's Gloo carries, declared as the library exports it (the wheel ships no Gloo
// headers; Debian's libgloo-dev gives the attribute struct): Note [Gloo over TLS] (gloo_tls.cpp).

#include <memory>
#include <string>

#include <gloo/transport/tcp/attr.h>

namespace gloo::transport {
class Device;
}

namespace gloo::transport::tcp::tls {
std::shared_ptr<::gloo::transport::Device> CreateDevice(const ::gloo::transport::tcp::attr& src, std::string pkey_file,
                                                        std::string cert_file, std::string ca_file, std::string ca_path);
}  // namespace gloo::transport::tcp::tls
