#pragma once
// The rendezvous store's listening socket, bound to the address the init method names: Note [The store's
// address] (store_socket.cpp).

#include <cstdint>
#include <string>

namespace hetseq {

/// A TCP socket bound to `host`:`port` (port 0: any free one) and listening, for c10d::TCPStoreOptions::
/// masterListenFd: the store then listens on that address only (tcp://127.0.0.1:P stays on loopback). Throws
/// hetseq::InputError naming `what` (the flag and its value) when the address cannot be resolved or bound.
int bind_store_socket(const std::string& host, uint16_t port, const std::string& what);

/// Whether `host` names only this machine (localhost, 127.0.0.0/8, ::1).
bool is_loopback_host(const std::string& host);

}  // namespace hetseq
