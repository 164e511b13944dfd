#pragma once
// Two "machines" for the tests: two network namespaces joined by a virtual Ethernet link (needs root, as the
// [netns] tests do).

#include <cstdint>
#include <string>
#include <vector>

namespace hetseq::test {

/// Two namespaces, node 0 at 10.77.0.1 and node 1 at 10.77.0.2 (each with its loopback up), removed on
/// destruction; Catch failures when `ip` refuses.
class TwoHosts {
 public:
  TwoHosts();
  ~TwoHosts();
  TwoHosts(const TwoHosts&) = delete;
  TwoHosts& operator=(const TwoHosts&) = delete;

  /// `argv` run in `node`'s namespace.
  std::vector<std::string> on(int node, std::vector<std::string> argv) const;
  /// `node`'s end of the link (a device name in its namespace).
  const std::string& device(int node) const { return devs_.at(node); }
  /// Shapes both directions of the link to `rate` (tc's syntax, e.g. "1gbit") with a token bucket.
  void shape(const std::string& rate) const;
  /// Bytes that `node`'s end of the link has sent so far (the kernel's counter, in its namespace).
  int64_t tx_bytes(int node) const;
  /// How often the token bucket on `node` held a packet back (tc's "overlimits"): 0 on a link that was never held
  /// to its rate.
  int64_t overlimits(int node) const;

 private:
  std::string ns0_, ns1_;
  std::vector<std::string> devs_;  // [node] its end of the veth pair
};

}  // namespace hetseq::test
