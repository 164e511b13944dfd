#pragma once
// The test binary's zygote: Note [Test zygote] (zygote_server.cpp).

#include <optional>
#include <string>
#include <vector>

namespace hetseq::test {

/// `hetseq-tests --zygote SOCKET`: serves hetseq-test-run's requests on SOCKET, forking one child per
/// request. Returns in each child, with the command line it was asked to run, its environment, working
/// directory and descriptors 0-2 in place; returns std::nullopt in the zygote itself once it stops (asked
/// to, replaced by a rebuilt binary, or idle).
std::optional<std::vector<std::string>> serve_as_zygote(const std::string& socket_path);

/// True in a test process that a zygote forked (Note [Test zygote]).
bool started_by_zygote();

}  // namespace hetseq::test
