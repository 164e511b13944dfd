#include "support/two_hosts.h"

#include <unistd.h>

#include <regex>

#include <catch2/catch.hpp>

#include "hetseq/core/format.h"
#include "support/subprocess.h"

using namespace std::chrono_literals;

namespace hetseq::test {
namespace {

void ip(const std::vector<std::string>& args) {
  std::vector<std::string> argv{"/usr/sbin/ip"};
  argv.insert(argv.end(), args.begin(), args.end());
  const auto r = run_process(argv, 30s);
  INFO("ip " << fmt::format("{}", fmt::join(args, " ")) << ": " << r.err);
  REQUIRE(r.exit_code == 0);
}

}  // namespace

TwoHosts::TwoHosts()
    : ns0_("hetseq-n0-" + std::to_string(::getpid())), ns1_("hetseq-n1-" + std::to_string(::getpid())) {
  ip({"netns", "add", ns0_});
  ip({"netns", "add", ns1_});
  const std::string a = "hsq0-" + std::to_string(::getpid() % 100000), b = "hsq1-" + std::to_string(::getpid() % 100000);
  ip({"link", "add", a, "type", "veth", "peer", "name", b});
  ip({"link", "set", a, "netns", ns0_});
  ip({"link", "set", b, "netns", ns1_});
  ip({"-n", ns0_, "addr", "add", "10.77.0.1/24", "dev", a});
  ip({"-n", ns1_, "addr", "add", "10.77.0.2/24", "dev", b});
  for (const auto& [ns, dev] : {std::pair{ns0_, a}, std::pair{ns1_, b}}) {
    ip({"-n", ns, "link", "set", dev, "up"});
    ip({"-n", ns, "link", "set", "lo", "up"});
  }
  devs_ = {a, b};
}

TwoHosts::~TwoHosts() {
  run_process({"/usr/sbin/ip", "netns", "del", ns0_}, 30s);
  run_process({"/usr/sbin/ip", "netns", "del", ns1_}, 30s);
}

std::vector<std::string> TwoHosts::on(int node, std::vector<std::string> argv) const {
  argv.insert(argv.begin(), {"/usr/sbin/ip", "netns", "exec", node == 0 ? ns0_ : ns1_});
  return argv;
}

void TwoHosts::shape(const std::string& rate) const {
  for (int node = 0; node < 2; ++node) {
    const auto r = run_process(on(node, {"/usr/sbin/tc", "qdisc", "add", "dev", devs_[node], "root", "tbf", "rate",
                                         rate, "burst", "256kb", "latency", "50ms"}),
                               30s);
    INFO("tc on node " << node << ": " << r.err);
    REQUIRE(r.exit_code == 0);
  }
}

int64_t TwoHosts::tx_bytes(int node) const {
  const auto r = run_process(on(node, {"/bin/cat", "/sys/class/net/" + devs_[node] + "/statistics/tx_bytes"}), 30s);
  REQUIRE(r.exit_code == 0);
  return std::stoll(r.out);
}

int64_t TwoHosts::overlimits(int node) const {
  const auto r = run_process(on(node, {"/usr/sbin/tc", "-s", "qdisc", "show", "dev", devs_[node]}), 30s);
  REQUIRE(r.exit_code == 0);
  std::smatch m;
  INFO("tc -s: " << r.out);
  REQUIRE(std::regex_search(r.out, m, std::regex("overlimits ([0-9]+)")));
  return std::stoll(m[1].str());
}

}  // namespace hetseq::test
