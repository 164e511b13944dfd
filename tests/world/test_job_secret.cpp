// A job's secret (issue 50): hetseq-train --make-secret and the checks on the secret file (Note [A job's secret]);
// the sealed store in one process over a HashStore (Note [Sealed store]); and real ranks over tcp:// on this
// machine: two ranks with a secret train to the weights of two without, a rank given another secret and an
// impostor on the store's port each stop the rendezvous with one line, and the store listens on the address named
// only (Note [The store's address]). The 2-rank runs meet through env:// (MASTER_ADDR, MASTER_PORT), which rank 0
// turns into tcp://MASTER_ADDR:MASTER_PORT: port 0, read back from rank 0's line, then given to rank 1.
#include <arpa/inet.h>
#include <netdb.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include "hetseq/checkpoint/checkpoint_file.h"
#include "hetseq/core/error.h"
#include "hetseq/world/job_secret.h"
#include "hetseq/world/sealed_store.h"
#include "support/error_message.h"
#include "support/mnist_files.h"
#include "support/process_checks.h"
#include "support/run_output.h"
#include "support/subprocess.h"
#include "support/temp_dir.h"
#include "support/test_paths.h"

using namespace hetseq::test;
using namespace std::chrono_literals;
using Catch::Contains;

namespace secret_test {

constexpr int kTimeout = 15;  // --distributed-timeout of the 2-rank runs, s
const char* const kNotSealed = "that was not sealed with this job's secret";
const char* const kUnsealedWarning = "takes connections from anyone who reaches that address";

std::vector<uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }
std::string text(const std::vector<uint8_t>& b) { return {b.begin(), b.end()}; }

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// A new secret of hetseq-train --make-secret at `path` (in-process: the program's own call).
std::string make_secret(const std::string& path) {
  hetseq::JobSecret::make(path);
  return path;
}

// Rank 0 of 2 on host: its store on a port the system picks (read back with read_port), HETSEQ_SECRET_FILE
// cleared unless `secret_env` names a file, so that a caller's own export cannot reach a run without a secret.
std::map<std::string, std::string> rank_env(int rank, const std::string& host, uint16_t port,
                                            const std::string& secret_env = "") {
  return {{"MASTER_ADDR", host},        {"MASTER_PORT", std::to_string(port)}, {"RANK", std::to_string(rank)},
          {"WORLD_SIZE", "2"},          {"LOCAL_RANK", std::to_string(rank)},  {hetseq::kSecretFileEnv, secret_env}};
}

// A rank of a 2-rank MNIST run of 5 updates on `data` (200 random samples), batch 8, checkpoints in `save`,
// --distributed-timeout 15 s, meeting through env://, with `more` appended.
std::vector<std::string> rank_args(const std::string& data, const std::string& save,
                                   const std::vector<std::string>& more = {}) {
  auto args = mnist_train_args(data, save);
  *(std::find(args.begin(), args.end(), "--distributed-timeout") + 1) = std::to_string(kTimeout);
  return with(with(args, {"--max-sentences", "8", "--max-update", "5", "--disable-validation",
                          "--distributed-init-method", "env://"}),
              more);
}

// The port of the store that `p` (a rank 0, or a node's launcher) reports listening on `host`.
uint16_t read_port(const Process& p, const std::string& host) {
  const bool listening = p.wait_for_err("listening on " + host + ":", 60s);
  INFO(p.err_so_far());
  REQUIRE(listening);
  std::smatch m;
  const std::string err = p.err_so_far();
  REQUIRE(std::regex_search(err, m, std::regex("listening on " + std::regex_replace(host, std::regex("\\."), "\\.") +
                                               ":([0-9]+)")));
  return static_cast<uint16_t>(std::stoi(m[1]));
}

// Both ranks of one 2-rank run: rank 0 started first, rank 1 once rank 0's store listens.
struct TwoRanks {
  ProcessResult rank0, rank1;
};
TwoRanks run_two_ranks(const std::vector<std::string>& args0, const std::vector<std::string>& args1,
                       const std::string& secret_env0 = "", const std::string& secret_env1 = "") {
  Process rank0(args0, rank_env(0, "127.0.0.1", 0, secret_env0));
  const uint16_t port = read_port(rank0, "127.0.0.1");
  Process rank1(args1, rank_env(1, "127.0.0.1", port, secret_env1));
  TwoRanks out;
  out.rank1 = rank1.wait(120s);
  out.rank0 = rank0.wait(120s);
  return out;
}

// The local addresses (ss's "ADDRESS:PORT") of the TCP sockets listening on `port`.
std::set<std::string> listening_on(uint16_t port) {
  std::string ss;
  for (const char* p : {"/usr/bin/ss", "/bin/ss", "/usr/sbin/ss", "/sbin/ss"}) {
    if (std::filesystem::exists(p)) ss = p;
  }
  REQUIRE(!ss.empty());  // iproute2
  const auto r = run_process({ss, "-ltnH"}, 30s);
  INFO("ss -ltnH: " << r.err);
  REQUIRE(r.exit_code == 0);
  std::set<std::string> out;
  std::istringstream lines(r.out);
  for (std::string line; std::getline(lines, line);) {
    std::istringstream fields(line);
    std::string state, recv_q, send_q, local;
    fields >> state >> recv_q >> send_q >> local;
    const auto colon = local.rfind(':');
    if (colon != std::string::npos && local.substr(colon + 1) == std::to_string(port)) out.insert(local);
  }
  return out;
}

// This machine's first IPv4 address off loopback (hostname -I), or "" where it has none.
std::string non_loopback_ipv4() {
  const auto r = run_process({"/usr/bin/hostname", "-I"}, 30s);
  std::istringstream words(r.out);
  for (std::string w; words >> w;) {
    if (w.find(':') == std::string::npos && w.rfind("127.", 0) != 0) return w;
  }
  return "";
}

// This machine's host name, and the first address it resolves to here, as the store's socket resolves it.
std::pair<std::string, std::string> own_name_and_address() {
  char name[256] = {};
  REQUIRE(::gethostname(name, sizeof(name) - 1) == 0);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_ADDRCONFIG;
  addrinfo* found = nullptr;
  if (::getaddrinfo(name, "0", &hints, &found) != 0) return {name, ""};
  char text[INET6_ADDRSTRLEN] = {};
  if (found->ai_family == AF_INET) {
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(found->ai_addr)->sin_addr, text, sizeof(text));
  } else {
    ::inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(found->ai_addr)->sin6_addr, text, sizeof(text));
  }
  ::freeaddrinfo(found);
  return {name, text};
}

// Waits until `path` exists; fails (with the impostor's output) when `impostor` stopped first or 60 s pass.
void wait_for_file(const std::string& path, const Process& impostor) {
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  while (!std::filesystem::exists(path)) {
    INFO("impostor's stderr so far:\n" << impostor.err_so_far());
    REQUIRE(std::chrono::steady_clock::now() < deadline);
    REQUIRE(hetseq::test::process_alive(impostor.pid()));
    std::this_thread::sleep_for(20ms);
  }
}

// Writes `content` to `path` as one step (the impostor polls for the name).
void publish(const std::string& path, const std::string& content) {
  std::ofstream(path + ".tmp") << content;
  std::filesystem::rename(path + ".tmp", path);
}

// A process without the job's secret on the store's port: torch's own TCPStore client, as anyone on the network
// could run it. It waits for the file "port" in FOLDER, lists the store's keys and reads every value (each must be
// sealed: the "hsq1" magic, and not the generation's token, which the key names show), then, by MODE:
//   probe: writes a key no rank reads, tries compare_set on the generation with a guessed value and add() on the
//          start barrier's sealed counter (the store's server refuses a counter that is not a number), and exits;
//   join:  writes a forged generation, claims rank 1 and marks it arrived, as rank 1 would but unsealed, touches
//          "forged", waits for "rank1-done", then sets the start barrier's verdict "ok", as the last rank to
//          arrive does.
// It exits non-zero when something it reads is plain or something it should not change changed.
const char* const kImpostor = R"PY(
import datetime, os, sys, time
import torch.distributed as dist

folder, mode = sys.argv[1], sys.argv[2]

def wait_for(name):
    path = os.path.join(folder, name)
    deadline = time.time() + 120
    while not os.path.exists(path):
        if time.time() > deadline:
            sys.exit("impostor: " + name + " never came")
        time.sleep(0.02)
    with open(path) as f:
        return f.read().strip()

def client(port):
    return dist.TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=10))

port = int(wait_for("port"))
store = client(port)
keys = store.list_keys()
generation = [k for k in keys if k.endswith("/generation")]
claim = [k for k in keys if k.endswith("/rank/0/by/1")]
if len(generation) != 1 or len(claim) != 1:
    sys.exit("impostor: no generation or no claim of rank 0 among " + repr(keys))
prefix = claim[0][: -len("/rank/0/by/1")]
token = prefix.rsplit("/", 1)[1].encode()
for key in keys:
    value = store.get(key)
    if not value.startswith(b"hsq1") or token in value:
        sys.exit("impostor: read a plain value under " + key + ": " + repr(value))
print("impostor: read", len(keys), "keys, every value sealed:", sorted(keys), flush=True)

if mode == "probe":
    store.set(prefix + "/impostor", b"no rank reads this")
    before = store.get(generation[0])
    if store.compare_set(generation[0], b"g0-0", b"gforged") == b"gforged" or store.get(generation[0]) != before:
        sys.exit("impostor: compare_set replaced the generation")
    try:
        client(port).add(prefix + "/arrived/w2/count", 1)
        sys.exit("impostor: add() on the start barrier's counter worked")
    except SystemExit:
        raise
    except Exception as e:
        print("impostor: add() on the sealed counter refused:", str(e).splitlines()[0], flush=True)
elif mode == "join":
    store.set(generation[0], b"gforged")
    store.add(prefix + "/rank/1", 1)
    store.set(prefix + "/rank/1/by/1", b"impostor 1 2")
    store.set(prefix + "/arrived/w2/1", b"\x01")
    open(os.path.join(folder, "forged"), "w").close()
    wait_for("rank1-done")
    store.set(prefix + "/arrived/w2/open", b"ok")
    print("impostor: forged the generation, rank 1's claim and arrival, and the start barrier's verdict", flush=True)
)PY";

}  // namespace secret_test

using namespace secret_test;

TEST_CASE("hetseq-train --make-secret writes 64 hex digits readable by its owner only and never over a file",
          "[distributed][secret]") {
  TempDir dir;
  const std::string path = dir / "job.secret";
  const auto made = run_hetseq_train({"--make-secret", path});
  require_success(made, "--make-secret");
  CHECK_THAT(made.out, Contains("--distributed-secret-file " + path));
  struct stat st {};
  REQUIRE(::stat(path.c_str(), &st) == 0);
  CHECK((st.st_mode & 07777) == 0600);
  const std::string secret = read_file(path);
  CHECK(std::regex_match(secret, std::regex("[0-9a-f]{64}\n")));

  // Never over an existing file: exit 2 naming it, the secret unchanged.
  const auto again = run_hetseq_train({"--make-secret", path});
  CHECK(again.exit_code == hetseq::kExitUsage);
  CHECK_THAT(again.err, Contains("--make-secret " + path + ": File exists") && Contains("choose a new path"));
  CHECK(read_file(path) == secret);

  // Each secret is new.
  require_success(run_hetseq_train({"--make-secret", dir / "other.secret"}), "--make-secret");
  CHECK(read_file(dir / "other.secret") != secret);
}

TEST_CASE("a secret file that others may read, a missing one and one not of --make-secret are exit 2 naming the "
          "file",
          "[distributed][secret]") {
  TempDir dir;
  write_random_mnist(dir.path(), 200, 20);
  const std::string good = make_secret(dir / "job.secret");
  // A rank of 2 that meets over a file: the secret is read before any store opens.
  auto rank0 = [&](const std::vector<std::string>& more) {
    return with(mnist_train_args(dir.path(), dir / "save"),
                with({"--max-sentences", "8", "--max-update", "1", "--distributed-world-size", "2",
                      "--distributed-rank", "0", "--distributed-init-method", "file://" + (dir / "rendezvous")},
                     more));
  };
  const std::map<std::string, std::string> no_env{{hetseq::kSecretFileEnv, ""}};
  for (const auto mode : {0644, 0640, 0604, 0620}) {
    CAPTURE(mode);
    const std::string shared = dir / "shared.secret";
    std::filesystem::copy_file(good, shared, std::filesystem::copy_options::overwrite_existing);
    REQUIRE(::chmod(shared.c_str(), static_cast<mode_t>(mode)) == 0);
    const auto r = run_process(rank0({"--distributed-secret-file", shared}), 120s, no_env);
    INFO(r.err);
    CHECK(r.exit_code == hetseq::kExitUsage);
    CHECK_THAT(line_with(r.err, "error:"), Contains("--distributed-secret-file " + shared + ": the file may be read by "
                                                    "others") &&
                                              Contains("chmod 600 " + shared));
    CHECK(!std::filesystem::exists(dir / "rendezvous"));
  }
  // The same through the environment, as torchrun and Slurm pass it: the line names the variable.
  {
    const auto r = run_process(rank0({}), 120s, {{hetseq::kSecretFileEnv, dir / "shared.secret"}});
    INFO(r.err);
    CHECK(r.exit_code == hetseq::kExitUsage);
    CHECK_THAT(r.err, Contains("HETSEQ_SECRET_FILE=" + (dir / "shared.secret") + ": the file may be read by others"));
  }
  {
    const auto r = run_process(rank0({"--distributed-secret-file", dir / "missing.secret"}), 120s, no_env);
    INFO(r.err);
    CHECK(r.exit_code == hetseq::kExitUsage);
    CHECK_THAT(line_with(r.err, "error:"), Contains("--distributed-secret-file " + (dir / "missing.secret") +
                                                    ": No such file or directory") &&
                                              Contains("hetseq-train --make-secret"));
  }
  {
    const std::string short_one = dir / "short.secret";
    std::ofstream(short_one) << std::string(63, 'a') << "\n";
    REQUIRE(::chmod(short_one.c_str(), 0600) == 0);
    const auto r = run_process(rank0({"--distributed-secret-file", short_one}), 120s, no_env);
    INFO(r.err);
    CHECK(r.exit_code == hetseq::kExitUsage);
    CHECK_THAT(r.err, Contains(short_one + ": not a secret of hetseq-train --make-secret"));
  }
}

TEST_CASE("a job's secret derives one key per purpose and is refused when it is not 64 hex digits",
          "[distributed][secret]") {
  TempDir dir;
  const auto a = hetseq::JobSecret::load(make_secret(dir / "a"), "--distributed-secret-file");
  const auto b = hetseq::JobSecret::load(make_secret(dir / "b"), "--distributed-secret-file");
  CHECK(a.path() == dir / "a");
  CHECK(a.derive("store") == hetseq::JobSecret::load(dir / "a", "--distributed-secret-file").derive("store"));
  CHECK(a.derive("store") != a.derive("tls"));
  CHECK(a.derive("store") != b.derive("store"));
  std::ofstream(dir / "bad") << std::string(31, 'a') << "zz" << std::string(31, 'a') << "\n";
  REQUIRE(::chmod((dir / "bad").c_str(), 0600) == 0);
  require_throws_naming<hetseq::UsageError>([&] { hetseq::JobSecret::load(dir / "bad", "--distributed-secret-file"); },
                                            "a character that is not a hexadecimal digit at position 32");
}

TEST_CASE("the sealed store seals every value, refuses one it did not seal and keeps c10d's semantics",
          "[distributed][secret][sealed_store]") {
  std::array<uint8_t, 32> key{}, other_key{};
  for (size_t i = 0; i < key.size(); ++i) {
    key[i] = static_cast<uint8_t>(i);
    other_key[i] = static_cast<uint8_t>(i + 1);
  }
  auto inner = c10::make_intrusive<c10d::HashStore>();
  auto store = c10::make_intrusive<hetseq::SealedStore>(inner, key, "--distributed-secret-file /path/job.secret");

  SECTION("a value round-trips, the inner store holds it sealed, each seal is new") {
    store->set("a", bytes("tcp://10.0.0.1:1234"));
    CHECK(text(store->get("a")) == "tcp://10.0.0.1:1234");
    const std::string sealed = text(inner->get("a"));
    CHECK(sealed.rfind("hsq1", 0) == 0);
    CHECK(sealed.find("10.0.0.1") == std::string::npos);
    CHECK(sealed.size() == 4 + 12 + 19 + 16);  // magic, nonce, the value's length, tag
    store->set("a", bytes("tcp://10.0.0.1:1234"));
    CHECK(text(inner->get("a")) != sealed);
    store->set("empty", std::vector<uint8_t>{});
    CHECK(store->get("empty").empty());
    store->multiSet({"m1", "m2"}, {bytes("x"), bytes("y")});
    CHECK(store->multiGet({"m1", "m2"}) == std::vector<std::vector<uint8_t>>{bytes("x"), bytes("y")});
    store->append("log", bytes("ab"));
    store->append("log", bytes("cd"));
    CHECK(text(store->get("log")) == "abcd");
    CHECK(text(inner->get("log")).rfind("hsq1", 0) == 0);
  }

  SECTION("a value written without the key is refused, by every call that reads it") {
    inner->set("raw", bytes("g1234-5678"));
    const std::string plain = error_of<hetseq::UsageError>([&] { store->get("raw"); });
    CHECK_THAT(plain, Contains("the rendezvous store holds a value under 'raw' that was not sealed with this job's "
                               "secret (not a sealed value; --distributed-secret-file /path/job.secret)"));
    inner->set("short", bytes("hsq1"));
    require_throws_naming<hetseq::UsageError>([&] { store->get("short"); }, "not a sealed value");
    // A counter, a compare-and-set and an append read the value they change: they refuse it too.
    require_throws_naming<hetseq::UsageError>([&] { store->add("raw", 1); }, "'raw' that was not sealed");
    require_throws_naming<hetseq::UsageError>([&] { store->compareSet("raw", {}, bytes("x")); }, "'raw'");
    require_throws_naming<hetseq::UsageError>([&] { store->append("raw", bytes("x")); }, "'raw'");
    require_throws_naming<hetseq::UsageError>([&] { store->multiGet({"raw"}); }, "'raw'");
    CHECK(text(inner->get("raw")) == "g1234-5678");
  }

  SECTION("a sealed value moved to another key, sealed with another key or changed in any byte is refused") {
    store->set("a", bytes("1"));
    inner->set("b", inner->get("a"));
    CHECK_THAT(error_of<hetseq::UsageError>([&] { store->get("b"); }),
               Contains("under 'b' that was not sealed") && Contains("its seal does not verify"));
    hetseq::SealedStore other(inner, other_key, "HETSEQ_SECRET_FILE=/path/other.secret");
    CHECK_THAT(error_of<hetseq::UsageError>([&] { other.get("a"); }),
               Contains("under 'a'") && Contains("HETSEQ_SECRET_FILE=/path/other.secret)"));
    const std::vector<uint8_t> sealed = store->seal("c", bytes("7"));
    CHECK(text(store->open("c", sealed)) == "7");
    for (size_t at = 4; at < sealed.size(); ++at) {  // the nonce, the value, the tag
      CAPTURE(at);
      std::vector<uint8_t> changed = sealed;
      changed[at] ^= 1;
      inner->set("c", changed);
      require_throws_naming<hetseq::UsageError>([&] { store->get("c"); }, "'c' that was not sealed");
    }
  }

  SECTION("add() counts exactly from two threads, as a sealed number") {
    std::vector<std::thread> threads;
    std::atomic<int> reached{0}, ready{0};
    for (int t = 0; t < 2; ++t) {
      threads.emplace_back([&] {
        for (++ready; ready < 2;) std::this_thread::yield();  // both start together, so that their adds race
        for (int i = 0; i < 500; ++i) {
          if (store->add("count", 1) == 1000) ++reached;
        }
      });
    }
    for (auto& t : threads) t.join();
    CHECK(store->add("count", 0) == 1000);
    CHECK(reached == 1);  // exactly one add saw the total, as a barrier's last rank must
    CHECK(text(store->get("count")) == "1000");
    CHECK(text(inner->get("count")).rfind("hsq1", 0) == 0);
    CHECK(store->add("count", -1000) == 0);
  }

  SECTION("compareSet answers as c10d's: set when absent and expected empty or when current, else the current") {
    c10d::HashStore reference;
    auto both = [&](const std::string& k, const std::string& expected, const std::string& desired) {
      const std::string mine = text(store->compareSet(k, bytes(expected), bytes(desired)));
      const std::string theirs = text(reference.compareSet(k, bytes(expected), bytes(desired)));
      CHECK(mine == theirs);
      return mine;
    };
    CHECK(both("k", "x", "y") == "x");  // absent, something expected: no change, the expected value back
    CHECK(!store->check({"k"}));
    CHECK(both("k", "", "first") == "first");  // absent, nothing expected: set
    CHECK(text(store->get("k")) == "first");
    CHECK(both("k", "", "second") == "first");  // present: the current value back
    CHECK(both("k", "other", "second") == "first");
    CHECK(both("k", "first", "second") == "second");  // as expected: set
    CHECK(text(store->get("k")) == "second");
    CHECK(text(reference.get("k")) == "second");
  }

  SECTION("names, waits and deletes pass through to the inner store") {
    store->set("w", bytes("1"));
    CHECK(store->check({"w"}));
    CHECK(store->getNumKeys() == inner->getNumKeys());
    store->wait({"w"}, std::chrono::milliseconds(100));
    CHECK(store->deleteKey("w"));
    CHECK(!inner->check({"w"}));
    auto copy = store->clone();
    store->set("z", bytes("9"));
    CHECK(text(copy->get("z")) == "9");
  }
}

TEST_CASE("two ranks with a secret train to the weights of two ranks without one, bit for bit",
          "[distributed][multiprocess][secret]") {
  TempDir dir;
  write_random_mnist(dir.path(), 200, 20);
  const std::string secret = make_secret(dir / "job.secret");
  const auto plain = run_two_ranks(rank_args(dir.path(), dir / "plain"), rank_args(dir.path(), dir / "plain"));
  require_all({plain.rank0, plain.rank1}, "without a secret");
  CHECK_THAT(plain.rank0.err, !Contains("sealed"));
  // Rank 0 names the file with the flag, rank 1 through the environment, as torchrun's workers get it.
  const auto sealed = run_two_ranks(rank_args(dir.path(), dir / "sealed", {"--distributed-secret-file", secret}),
                                    rank_args(dir.path(), dir / "sealed"), "", secret);
  require_all({sealed.rank0, sealed.rank1}, "with a secret");
  CHECK_THAT(sealed.rank0.err, Contains("its values sealed with the job's secret"));
  CHECK(json_lines(sealed.rank0.out, "train").size() == 5);
  check_same_training_state(hetseq::load_checkpoint(dir / "plain/checkpoint_last.pt"),
                            hetseq::load_checkpoint(dir / "sealed/checkpoint_last.pt"));
}

TEST_CASE("a rank given another secret or none exits 2 naming its file and rank 0 stops within "
          "--distributed-timeout naming it",
          "[distributed][multiprocess][secret]") {
  TempDir dir;
  write_random_mnist(dir.path(), 200, 20);
  const std::string secret = make_secret(dir / "job.secret");
  const std::string wrong = make_secret(dir / "another.secret");
  Process rank0(rank_args(dir.path(), dir / "save", {"--distributed-secret-file", secret}),
                rank_env(0, "127.0.0.1", 0));
  const uint16_t port = read_port(rank0, "127.0.0.1");
  // A rank 1 without a secret first: it claims nothing, so the rank 1 after it finds the store as rank 0 left it.
  const auto none = run_process(rank_args(dir.path(), dir / "save"), 120s, rank_env(1, "127.0.0.1", port));
  const auto r1 = run_process(rank_args(dir.path(), dir / "save", {"--distributed-secret-file", wrong}), 120s,
                              rank_env(1, "127.0.0.1", port));
  const auto rank1_done = std::chrono::steady_clock::now();
  const auto r0 = rank0.wait(120s);
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - rank1_done).count();
  INFO("rank 0:\n" << r0.err << "\nrank 1:\n" << r1.err << "\nrank 1 without a secret:\n" << none.err
                    << "\nrank 0 stopped " << waited << " s after rank 1");
  CHECK(none.exit_code == hetseq::kExitUsage);
  CHECK_THAT(line_with(none.err, "error:"),
             Contains("rank 1: the rendezvous store at 'env://' is sealed with the job's secret and this rank was "
                      "given none: give every rank the same --distributed-secret-file (or HETSEQ_SECRET_FILE)"));
  CHECK(r1.exit_code == hetseq::kExitUsage);
  CHECK_THAT(line_with(r1.err, "error:"),
             Contains("the rendezvous store holds a value under 'hetseq/run/0/generation' " +
                      std::string(kNotSealed)) &&
                 Contains("--distributed-secret-file " + wrong + ")") && Contains("give every rank the same secret"));
  CHECK(!r0.timed_out);
  CHECK(r0.exit_code == hetseq::kExitPeerLost);
  CHECK_THAT(line_with(r0.err, "error:"), Contains("rank 0: rank(s) 1 of 2 never arrived within 15 s"));
  CHECK(waited < kTimeout + 5);
  CHECK(json_lines(r0.out, "train").empty());
}

TEST_CASE("an impostor on the store's port reads only sealed values and what it writes where no rank reads leaves "
          "the training bit for bit as it was",
          "[distributed][multiprocess][secret][impostor]") {
  const std::string python = python_path();
  REQUIRE(!python.empty());  // the venv of scripts/setup.sh; set HETSEQ_PYTHON at configure time otherwise
  TempDir dir;
  write_random_mnist(dir.path(), 200, 20);
  const std::string secret = make_secret(dir / "job.secret");
  const auto plain = run_two_ranks(rank_args(dir.path(), dir / "plain"), rank_args(dir.path(), dir / "plain"));
  require_all({plain.rank0, plain.rank1}, "without an impostor");

  Process impostor({python, "-c", kImpostor, dir.path(), "probe"});
  const auto args = rank_args(dir.path(), dir / "sealed", {"--distributed-secret-file", secret});
  Process rank0(args, rank_env(0, "127.0.0.1", 0));
  const uint16_t port = read_port(rank0, "127.0.0.1");
  REQUIRE(rank0.wait_for_err("rank 0 of 2 joined", 60s));  // waiting for rank 1 at the start barrier
  publish(dir / "port", std::to_string(port));
  const auto probe = impostor.wait(60s);
  INFO("impostor:\n" << probe.out << probe.err);
  REQUIRE(probe.exit_code == 0);
  CHECK_THAT(probe.out, Contains("every value sealed") && Contains("add() on the sealed counter refused"));
  Process rank1(args, rank_env(1, "127.0.0.1", port));
  const auto r1 = rank1.wait(120s);
  const auto r0 = rank0.wait(120s);
  require_all({r0, r1}, "beside the impostor");
  check_same_training_state(hetseq::load_checkpoint(dir / "plain/checkpoint_last.pt"),
                            hetseq::load_checkpoint(dir / "sealed/checkpoint_last.pt"));
}

TEST_CASE("an impostor that forges the generation and joins as rank 1 stops both ranks with exit 2 naming the key "
          "it forged, before any update",
          "[distributed][multiprocess][secret][impostor]") {
  const std::string python = python_path();
  REQUIRE(!python.empty());
  TempDir dir;
  write_random_mnist(dir.path(), 200, 20);
  const std::string secret = make_secret(dir / "job.secret");
  const auto args = rank_args(dir.path(), dir / "save", {"--distributed-secret-file", secret});

  Process impostor({python, "-c", kImpostor, dir.path(), "join"});
  Process rank0(args, rank_env(0, "127.0.0.1", 0));
  const uint16_t port = read_port(rank0, "127.0.0.1");
  REQUIRE(rank0.wait_for_err("rank 0 of 2 joined", 60s));
  publish(dir / "port", std::to_string(port));
  wait_for_file(dir / "forged", impostor);
  // Rank 1 reads the generation first: forged, it is refused.
  const auto r1 = run_process(args, 120s, rank_env(1, "127.0.0.1", port));
  publish(dir / "rank1-done", "");
  // Rank 0 waits at the start barrier until the impostor sets its verdict: forged, it is refused.
  const auto r0 = rank0.wait(120s);
  const auto forged = impostor.wait(60s);
  INFO("rank 0:\n" << r0.err << "\nrank 1:\n" << r1.err << "\nimpostor:\n" << forged.out << forged.err);
  CHECK(forged.exit_code == 0);
  CHECK(r1.exit_code == hetseq::kExitUsage);
  CHECK_THAT(line_with(r1.err, "error:"),
             Contains("under 'hetseq/run/0/generation' " + std::string(kNotSealed) + " (not a sealed value; "
                      "--distributed-secret-file " + secret + ")"));
  CHECK(!r0.timed_out);
  CHECK(r0.exit_code == hetseq::kExitUsage);
  CHECK_THAT(line_with(r0.err, "error:"), Contains("/arrived/w2/open' " + std::string(kNotSealed)));
  // No forged value was used: no update ran, no checkpoint was written.
  CHECK(json_lines(r0.out, "train").empty());
  CHECK(json_lines(r1.out, "train").empty());
  CHECK(!std::filesystem::exists(dir / "save/checkpoint_last.pt"));
}

TEST_CASE("the store listens on the address named only and warns off loopback without a secret",
          "[distributed][multiprocess][secret][bind]") {
  TempDir dir;
  write_random_mnist(dir.path(), 200, 20);
  const std::string secret = make_secret(dir / "job.secret");
  // Rank 0 of 2 on `host`, waiting for a rank 1 that never comes: where its store listens, and whether it warned.
  auto rank0_on = [&](const std::string& host, const std::vector<std::string>& more) {
    Process rank0(rank_args(dir.path(), dir / "save", more), rank_env(0, host, 0));
    const uint16_t port = read_port(rank0, host);
    REQUIRE(rank0.wait_for_err("rank 0 of 2 joined", 60s));  // past the point where it warns
    const std::set<std::string> addresses = listening_on(port);
    const std::string err = rank0.err_so_far();
    rank0.kill();
    rank0.wait(30s);
    INFO("rank 0:\n" << err);
    CHECK(addresses == std::set<std::string>{host + ":" + std::to_string(port)});
    return err;
  };
  CHECK_THAT(rank0_on("127.0.0.1", {}), !Contains(kUnsealedWarning));
  CHECK_THAT(rank0_on("127.0.0.1", {"--distributed-secret-file", secret}), !Contains(kUnsealedWarning));

  // This machine's name: where it resolves to loopback here (Debian's 127.0.1.1), the store stays there and says
  // that no other machine reaches it.
  {
    const auto [name, address] = own_name_and_address();
    CAPTURE(name, address);
    if (!address.empty()) {
      Process rank0(rank_args(dir.path(), dir / "save", {"--distributed-secret-file", secret}),
                    rank_env(0, name, 0));
      const uint16_t port = read_port(rank0, name);
      REQUIRE(rank0.wait_for_err("rank 0 of 2 joined", 60s));
      const std::set<std::string> addresses = listening_on(port);
      const std::string err = rank0.err_so_far();
      rank0.kill();
      rank0.wait(30s);
      INFO("rank 0:\n" << err);
      const std::string shown = address.find(':') != std::string::npos ? "[" + address + "]" : address;
      CHECK(addresses == std::set<std::string>{shown + ":" + std::to_string(port)});
      const bool loopback = address.rfind("127.", 0) == 0 || address == "::1";
      CHECK((line_with(err, "a loopback address: the store listens there only").find(
                 "'" + name + "' is " + address + " on this machine") != std::string::npos) == loopback);
    }
  }

  // A node's launcher hosts the store for its workers: on the address named too.
  {
    Process node(with(mnist_train_args(dir.path(), dir / "node"),
                      {"--max-sentences", "8", "--disable-validation", "--distributed-gpus", "2",
                       "--distributed-world-size", "2", "--distributed-init-method", "tcp://127.0.0.1:0"}),
                 {{hetseq::kSecretFileEnv, ""}});  // no --max-update: it trains until killed
    const uint16_t port = read_port(node, "127.0.0.1");
    const std::set<std::string> addresses = listening_on(port);
    node.kill();
    node.wait(30s);
    CHECK(addresses == std::set<std::string>{"127.0.0.1:" + std::to_string(port)});
  }

  const std::string host = non_loopback_ipv4();
  if (host.empty()) {
    WARN("this machine has no IPv4 address off loopback (hostname -I): only loopback was checked");
    return;
  }
  CAPTURE(host);
  const std::string warned = rank0_on(host, {});
  CHECK_THAT(line_with(warned, kUnsealedWarning),
             Contains("[rendezvous] the store on " + host + ":") && Contains("--distributed-secret-file") &&
                 Contains("docs/security.md"));
  CHECK_THAT(rank0_on(host, {"--distributed-secret-file", secret}), !Contains(kUnsealedWarning));
  // Where the launcher hosts the store, rank 0 warns for it, once.
  {
    Process node(with(mnist_train_args(dir.path(), dir / "node"),
                      {"--max-sentences", "8", "--disable-validation", "--distributed-gpus", "2",
                       "--distributed-world-size", "2", "--distributed-init-method", "tcp://" + host + ":0"}),
                 {{hetseq::kSecretFileEnv, ""}});
    const uint16_t port = read_port(node, host);
    const std::set<std::string> addresses = listening_on(port);
    const bool warned_once = node.wait_for_err(kUnsealedWarning, 60s);
    const std::string err = node.err_so_far();
    node.kill();
    node.wait(30s);
    INFO("node:\n" << err);
    CHECK(addresses == std::set<std::string>{host + ":" + std::to_string(port)});
    CHECK(warned_once);
    CHECK(err.find(kUnsealedWarning) == err.rfind(kUnsealedWarning));
  }
}
