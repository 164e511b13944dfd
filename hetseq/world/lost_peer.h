#pragma once
/// A lost peer as the process group reports it: waiting for a collective so that its failure is a
/// hetseq::PeerError naming the collective, and recognising the backend's own errors of a lost peer
/// that reach a caller unwrapped. See Note [Lost peers in collectives].

#include <cstdint>
#include <exception>
#include <string_view>

#include <torch/csrc/distributed/c10d/Work.hpp>

namespace hetseq {

/// Waits for `work`, a collective of rank `rank` of `world_size` named `what` in messages ("allgather of
/// the parameters' shards"). Throws hetseq::PeerError naming the rank and the collective, with the
/// backend's own words, when it fails: a peer died, fell behind past --distributed-timeout, or reached
/// another collective.
void wait_for_peers(const c10::intrusive_ptr<c10d::Work>& work, int64_t rank, int64_t world_size,
                    std::string_view what);

/// Whether `e` is the backend's report of a lost peer: c10d's DistError, any of Gloo's own exceptions
/// (a connection reset or closed by the peer, a read or write error, a timeout), or another error that
/// carries Gloo's words for these. The drivers exit with kExitPeerLost on it.
bool is_lost_peer(const std::exception& e);

}  // namespace hetseq
