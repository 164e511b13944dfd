// Gloo over mutual TLS between two machines (issue 50; Note [Gloo over TLS], Note [Gloo's TLS pairs]): two ranks
// in two network namespaces, once without a secret and once with one, while a raw socket on node 0's end of the
// link records how every Gloo connection begins (tests/world/first_bytes.py). With the secret every pair speaks
// TLS records only, after the sequence number Gloo's listener reads in clear; without one the same capture sees
// Gloo's own messages (the capture's control); both runs end with the same parameters and optimizer state.
#include <signal.h>

#include <filesystem>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "hetseq/checkpoint/checkpoint_file.h"
#include "hetseq/world/job_secret.h"
#include "support/mnist_files.h"
#include "support/process_checks.h"
#include "support/run_output.h"
#include "support/subprocess.h"
#include "support/temp_dir.h"
#include "support/test_paths.h"
#include "support/two_hosts.h"

using namespace hetseq::test;
using namespace std::chrono_literals;
using Catch::Contains;

namespace gloo_tls_test {

// How a stream began: each of its first segments with data as "HEX/LENGTH" (first_bytes.py).
using Streams = std::map<std::string, std::vector<std::string>>;

// Whether a captured segment starts a TLS record: a content type of 20-23 (change cipher spec, alert, handshake,
// application data), then the major version 3.
bool tls_record(const std::string& segment) {
  const std::string type = segment.substr(0, 2);
  return (type == "14" || type == "15" || type == "16" || type == "17") && segment.substr(2, 2) == "03";
}

// Gloo's routing preamble: the pair's 8-byte sequence number, which its listener reads before anything else.
bool sequence_number(const std::string& segment) { return segment.size() > 2 && segment.substr(segment.size() - 2) == "/8"; }

struct Run {
  ProcessResult rank0, rank1;
  Streams streams;
};

// Two ranks, rank r in node r's namespace, meeting at 10.77.0.1:`port`, 5 updates of batch 8 on `data`, checkpoints
// in `save`, with `more` on both command lines; the capture runs on node 0's end of the link throughout.
Run train_between(const TwoHosts& hosts, const std::string& data, const std::string& save, int port,
                  const std::vector<std::string>& more) {
  Process capture(hosts.on(0, {"/usr/bin/python3", source_dir() + "/tests/world/first_bytes.py", hosts.device(0),
                               std::to_string(port)}));
  REQUIRE(capture.wait_for_err("ready", 30s));
  auto rank = [&](int r) {
    return hosts.on(r, with(with(mnist_train_args(data, save),
                                 {"--max-sentences", "8", "--max-update", "5", "--disable-validation",
                                  "--distributed-world-size", "2", "--distributed-gpus", "1", "--distributed-rank",
                                  std::to_string(r), "--distributed-init-method",
                                  "tcp://10.77.0.1:" + std::to_string(port)}),
                            more));
  };
  const std::map<std::string, std::string> env{{hetseq::kSecretFileEnv, ""}};
  Process node0(rank(0), env);
  REQUIRE(node0.wait_for_err("listening on 10.77.0.1:" + std::to_string(port), 60s));
  Process node1(rank(1), env);
  Run run;
  run.rank0 = node0.wait(180s);
  run.rank1 = node1.wait(180s);
  ::kill(capture.pid(), SIGTERM);
  const auto captured = capture.wait(30s);
  INFO("capture: " << captured.err);
  REQUIRE(captured.exit_code == 0);
  run.streams = nlohmann::json::parse(captured.out).at("streams").get<Streams>();
  return run;
}

}  // namespace gloo_tls_test

using namespace gloo_tls_test;

TEST_CASE("two ranks in two network namespaces with a secret: every Gloo pair speaks TLS and they train to the "
          "weights of plain Gloo, bit for bit",
          "[distributed][multiprocess][netns][secret][tls]") {
  TwoHosts hosts;
  TempDir dir;
  write_random_mnist(dir.path(), 200, 20);
  const std::string secret = dir / "job.secret";
  hetseq::JobSecret::make(secret);

  const gloo_tls_test::Run plain = train_between(hosts, dir.path(), dir / "plain", 29500, {});
  require_all({plain.rank0, plain.rank1}, "plain Gloo");
  CHECK_THAT(plain.rank0.err, !Contains("over TLS"));
  // The control: the capture sees Gloo's connections, and without TLS their messages are not TLS records.
  REQUIRE(!plain.streams.empty());
  size_t clear = 0;
  for (const auto& [stream, segments] : plain.streams) {
    for (const auto& segment : segments) clear += !tls_record(segment) && !sequence_number(segment);
  }
  CAPTURE(nlohmann::json(plain.streams).dump());
  CHECK(clear > 0);

  const gloo_tls_test::Run sealed = train_between(hosts, dir.path(), dir / "sealed", 29501, {"--distributed-secret-file", secret});
  require_all({sealed.rank0, sealed.rank1}, "Gloo over TLS");
  CHECK_THAT(sealed.rank0.err, Contains("[process-group] Gloo's connections over TLS 1.3"));
  CHECK_THAT(sealed.rank1.err, Contains("[process-group] Gloo's connections over TLS 1.3"));
  REQUIRE(!sealed.streams.empty());
  size_t handshakes = 0;
  for (const auto& [stream, segments] : sealed.streams) {
    CAPTURE(stream, segments);
    for (size_t i = 0; i < segments.size(); ++i) {
      // The connecting end's first segment is Gloo's sequence number; everything else is a TLS record.
      const bool allowed = tls_record(segments[i]) || (i == 0 && sequence_number(segments[i]));
      CHECK(allowed);
      handshakes += segments[i].rfind("16", 0) == 0;
    }
  }
  CHECK(handshakes >= sealed.streams.size());  // a hello in each direction of every pair
  check_same_training_state(hetseq::load_checkpoint(dir / "plain/checkpoint_last.pt"),
                            hetseq::load_checkpoint(dir / "sealed/checkpoint_last.pt"));
}
