// A rank waiting at the start barrier says whom it waits for (Note [Saying whom a barrier waits for]):
// ranks as threads meeting over a real TCPStore on loopback.
#include <algorithm>
#include <regex>
#include <thread>

#include <catch2/catch.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "hetseq/core/error.h"
#include "hetseq/core/logging.h"
#include "hetseq/world/rendezvous.h"
#include "hetseq/world/rendezvous_keys.h"
#include "support/error_message.h"

using namespace hetseq;
using namespace std::chrono_literals;
using Catch::Contains;

namespace {

RendezvousOptions waiting_rank(const std::string& init_method, int64_t rank, int64_t world_size,
                               std::chrono::milliseconds timeout) {
  RendezvousOptions o;
  o.init_method = init_method;
  o.rank = rank;
  o.world_size = world_size;
  o.timeout = timeout;
  o.report_interval = 250ms;  // 15 s by default
  return o;
}

size_t count_lines(const std::vector<std::string>& lines, const std::string& line) {
  return static_cast<size_t>(std::count(lines.begin(), lines.end(), line));
}

}  // namespace

TEST_CASE("rank runs are written compactly", "[rendezvous][report]") {
  CHECK(rank_runs({1}, false) == "1..1");
  CHECK(rank_runs({1}, true) == "1");
  CHECK(rank_runs({0, 2, 3, 4, 7}, true) == "0, 2..4, 7");
  CHECK(rank_runs({0, 2, 3, 4, 7}, false) == "0..0, 2..4, 7..7");
  CHECK(rank_runs({}, true) == "none");
}

TEST_CASE("rank 0 alone at tcp://127.0.0.1:0 says every interval that it waits for rank 1 at the port it got",
          "[rendezvous][report]") {
  log::set_rank(0);
  log::begin_capture();
  const std::string error =
      test::error_of<PeerError>([] { rendezvous(waiting_rank("tcp://127.0.0.1:0", 0, 2, 1500ms)); });
  const std::vector<std::string> lines = log::end_capture();
  CHECK_THAT(error, Contains("rank 0: rank(s) 1 of 2 never arrived within 1 s"));
  std::string port;
  for (const auto& line : lines) {
    std::smatch m;
    if (std::regex_match(line, m, std::regex(R"(\[rendezvous\] store listening on 127\.0\.0\.1:(\d+))"))) port = m[1];
  }
  INFO(fmt::format("{}", fmt::join(lines, "\n")));
  REQUIRE_FALSE(port.empty());
  const std::string waiting = fmt::format("[rendezvous] waiting for ranks 1..1 of 2 at tcp://127.0.0.1:{} (joined: 0)", port);
  // 1.5 s with a line every 0.25 s: five, give or take the machine's delays.
  CHECK(count_lines(lines, waiting) >= 3);
  CHECK(count_lines(lines, waiting) <= 6);
}

TEST_CASE("ranks 0 and 2 of 3 name the missing rank 1 and those joined until it comes, then all pass",
          "[rendezvous][report]") {
  log::set_rank(0);
  // The store as a launcher hosts it (port 0, read back), so that every rank is its client.
  c10d::TCPStoreOptions server;
  server.port = 0;
  server.isServer = true;
  server.waitWorkers = false;
  auto store = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", server);
  const std::string address = fmt::format("tcp://127.0.0.1:{}", store->getPort());
  std::vector<std::exception_ptr> errors(3);
  std::vector<int64_t> joined_ranks(3, -1);
  auto join = [&](int64_t rank) {
    try {
      RendezvousOptions o = waiting_rank(address, rank, 3, 20s);
      o.store_hosted_elsewhere = true;
      joined_ranks[static_cast<size_t>(rank)] = rendezvous(o).rank;
    } catch (...) {
      errors[static_cast<size_t>(rank)] = std::current_exception();
    }
  };
  log::begin_capture();
  std::thread zero(join, 0), two(join, 2);
  std::this_thread::sleep_for(1200ms);  // several intervals with rank 1 missing
  std::thread one(join, 1);
  for (auto* t : {&zero, &one, &two}) t->join();
  const std::vector<std::string> lines = log::end_capture();
  INFO(fmt::format("{}", fmt::join(lines, "\n")));
  for (size_t r = 0; r < 3; ++r) {
    CHECK(!errors[r]);
    CHECK(joined_ranks[r] == static_cast<int64_t>(r));
  }
  const std::string waiting = fmt::format("[rendezvous] waiting for ranks 1..1 of 3 at {} (joined: 0, 2)", address);
  CHECK(count_lines(lines, waiting) >= 2);
  for (const auto& line : lines) {
    if (line.find("waiting for") == std::string::npos) continue;
    CHECK_THAT(line, Contains(" of 3 at " + address + " (joined: "));
  }
}
