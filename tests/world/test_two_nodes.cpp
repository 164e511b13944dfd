// Two "nodes" in two network namespaces joined by a veth pair, each started with its own command line
// as in HetSeq's two-node example, training together over tcp:// on the first node's address.
#include <unistd.h>

#include <filesystem>
#include <map>
#include <regex>

#include <catch2/catch.hpp>

#include "hetseq/core/error.h"
#include "hetseq/core/format.h"
#include "support/subprocess.h"
#include "support/two_hosts.h"

using namespace hetseq::test;
using namespace std::chrono_literals;

// Node 0's store in the namespaces each test makes afresh.
const char* const kTwoNodesInit = "tcp://10.77.0.1:29500";

TEST_CASE("two nodes in two network namespaces train together over tcp://", "[distributed][multiprocess][netns]") {
  TwoHosts hosts;
  TempDir dir;
  auto node_args = [&](int rank, const std::string& init, const std::string& batch) {
    return hosts.on(rank, {binary_path("hetseq-train"), "--task", "mnist", "--cpu", "--max-sentences", batch,
                           "--optimizer", "adam", "--lr", "0.001", "--max-update", "20", "--valid-subset", "test",
                           "--max-sentences-valid", "1000", "--num-workers", "0", "--intra-op-threads", "1",
                           "--no-progress-bar", "--log-format", "json", "--save-dir", dir / "save",
                           "--distributed-world-size", "2", "--distributed-gpus", "1", "--distributed-rank",
                           std::to_string(rank), "--distributed-init-method", init, "--distributed-timeout", "60"});
  };
  // A fixed port: nothing else listens in the namespaces this test made, and port 0 is refused where another
  // command's rank must join (Note [Port 0]).
  Process node0(node_args(0, kTwoNodesInit, "64"));
  REQUIRE(node0.wait_for_err("listening on 10.77.0.1:29500", 60s));
  Process node1(node_args(1, kTwoNodesInit, "32"));
  const auto r0 = node0.wait(300s);
  const auto r1 = node1.wait(300s);
  INFO("node 0:\n" << r0.err << "\nnode 1:\n" << r1.err);
  REQUIRE(r0.exit_code == 0);
  REQUIRE(r1.exit_code == 0);
  CHECK_THAT(r0.err, Catch::Contains("rank 1 on") && Catch::Contains("batch size 32"));
  // Two nodes share no memory: --shared-memory-reduce auto left the buckets on Gloo.
  CHECK_THAT(r0.err, !Catch::Contains("all on this machine, sum their gradients through shared memory"));
  CHECK_THAT(r0.out, Catch::Contains("\"tag\":\"valid\""));
  CHECK(std::filesystem::exists(dir / "save/checkpoint_last.pt"));
}

TEST_CASE("two nodes with --shared-memory-reduce on: a usage error on both, naming the flag and the rank elsewhere",
          "[distributed][multiprocess][netns][shm]") {
  TwoHosts hosts;
  auto node_args = [&](int rank, const std::string& init) {
    return hosts.on(rank, {binary_path("hetseq-train"), "--task", "mnist", "--cpu",
                           "--max-sentences", "8", "--max-update", "1", "--disable-validation", "--no-save",
                           "--num-workers", "0", "--intra-op-threads", "1", "--no-progress-bar",
                           "--shared-memory-reduce", "on", "--distributed-world-size", "2", "--distributed-gpus", "1",
                           "--distributed-rank", std::to_string(rank), "--distributed-init-method", init,
                           "--distributed-timeout", "30"});
  };
  // A fixed port: a node that starts one rank of several cannot pick one (port 0), and in a network namespace
  // made for this test nothing else can hold it.
  const std::string init = "tcp://10.77.0.1:29500";
  Process node0(node_args(0, init));
  const bool listening = node0.wait_for_err("listening on 10.77.0.1:29500", 60s);
  INFO(node0.err_so_far());
  REQUIRE(listening);
  Process node1(node_args(1, init));
  const auto r0 = node0.wait(120s);
  const auto r1 = node1.wait(120s);
  for (const auto* r : {&r0, &r1}) {
    INFO("node 0:\n" << r0.err << "\nnode 1:\n" << r1.err);
    CHECK(r->exit_code == hetseq::kExitUsage);
    CHECK_THAT(r->err, Catch::Contains("error: --shared-memory-reduce on: rank 1 runs on another machine than rank 0 "
                                       "(or in another network namespace)") &&
                           Catch::Contains("use --shared-memory-reduce auto or off"));
  }
}

TEST_CASE("two nodes joined by a link shaped to 1 Gbit/s train with the fp16 comm hook, sending half the bytes",
          "[distributed][multiprocess][netns]") {
  TwoHosts hosts;
  hosts.shape("1gbit");
  TempDir dir;
  auto node_args = [&](int rank, const std::string& init, const std::string& hook) {
    return hosts.on(rank, {binary_path("hetseq-train"), "--task", "mnist", "--cpu", "--max-sentences", "32",
                           "--optimizer", "adam", "--lr", "0.001", "--max-update", "6", "--disable-validation",
                           "--no-save", "--num-workers", "0", "--intra-op-threads", "1", "--no-progress-bar",
                           "--log-format", "json", "--ddp-comm-hook", hook, "--distributed-world-size", "2",
                           "--distributed-gpus", "1", "--distributed-rank", std::to_string(rank),
                           "--distributed-init-method", init, "--distributed-timeout", "60"});
  };
  // The same 6 updates without a hook and with the fp16 hook; the bytes each node's end of the link sent.
  std::map<std::string, int64_t> sent;  // [hook]
  std::string fp16_out;
  for (const std::string hook : {"none", "fp16"}) {
    CAPTURE(hook);
    const int64_t before = hosts.tx_bytes(0) + hosts.tx_bytes(1);
    // A port of its own for each run: the last run's store may still hold its port in TIME_WAIT.
    const std::string port = hook == "none" ? "29501" : "29502";
    Process node0(node_args(0, "tcp://10.77.0.1:" + port, hook));
    REQUIRE(node0.wait_for_err("listening on 10.77.0.1:" + port, 60s));
    Process node1(node_args(1, "tcp://10.77.0.1:" + port, hook));
    const auto r0 = node0.wait(300s);
    const auto r1 = node1.wait(300s);
    INFO("node 0:\n" << r0.err << "\nnode 1:\n" << r1.err);
    REQUIRE(r0.exit_code == 0);
    REQUIRE(r1.exit_code == 0);
    std::smatch updates;
    REQUIRE(std::regex_search(r0.out, updates, std::regex("\"tag\":\"train_epoch\".*\"num_updates\":([0-9]+)")));
    CHECK(updates[1].str() == "6");
    sent[hook] = hosts.tx_bytes(0) + hosts.tx_bytes(1) - before;
    if (hook == "fp16") fp16_out = r0.out;
  }
  // The shaping is real: the token bucket held packets back on both ends (waiting for a slow peer
  // never counts here, unlike in a bandwidth figure).
  CHECK(hosts.overlimits(0) > 0);
  CHECK(hosts.overlimits(1) > 0);
  // The hook halves the gradients on the wire: float16 buckets instead of float32. The rest (the
  // rendezvous, the model check, statistics) is small beside 6 updates of MNIST's 1.2 M parameters.
  INFO("bytes sent: " << sent["none"] << " without a hook, " << sent["fp16"] << " with fp16");
  CHECK(sent["none"] > 6 * 4 * 1000000);
  const double ratio = static_cast<double>(sent["fp16"]) / static_cast<double>(sent["none"]);
  CHECK(ratio > 0.45);
  CHECK(ratio < 0.6);
  std::smatch busbw;
  REQUIRE(std::regex_search(fp16_out, busbw, std::regex("\"busbw_gb_per_s\":\\[([0-9.e+-]+),([0-9.e+-]+)\\]")));
  CHECK(std::stod(busbw[1].str()) > 0);
}
