// The memory probe's search (Note [Balancing], memory caps), level 1: the sizes that run out of memory
// are given by a function that throws LibTorch's own c10::OutOfMemoryError, as a CUDA device does.
#include <catch2/catch.hpp>

#include <c10/util/Exception.h>

#include "hetseq/balance/memory_probe.h"
#include "hetseq/core/error.h"
#include "support/error_message.h"

using hetseq::ProbeOptions;

namespace {

// A device on which micro-batches above `fits` samples run out of memory; records what was tried.
struct Device {
  int64_t fits;
  std::vector<int64_t> tried;
  int released = 0;
  void run(int64_t b) {
    tried.push_back(b);
    if (b > fits) throw c10::OutOfMemoryError({__func__, __FILE__, static_cast<uint32_t>(__LINE__)}, "CUDA out of memory");
  }
};

int64_t probe(Device& d, int64_t start, int64_t limit) {
  ProbeOptions o;
  o.start = start;
  o.limit = limit;
  return hetseq::probe_micro_batch_cap([&](int64_t b) { d.run(b); }, [&] { ++d.released; }, o);
}

}  // namespace

TEST_CASE("Memory probe: sizes double until one runs out of memory, and the cap keeps a margin", "[balance]") {
  Device d{100};
  CHECK(probe(d, 16, 1024) == 51);  // 16, 32, 64 ran, 128 did not: 0.8 * 64
  CHECK(d.tried == std::vector<int64_t>{16, 32, 64, 128});
  CHECK(d.released == 4);  // after every try, the failed one included
}

TEST_CASE("Memory probe: no cap when a whole update fits, an error when the batch size does not", "[balance]") {
  Device big{1000};
  CHECK(probe(big, 16, 192) == 0);
  CHECK(big.tried == std::vector<int64_t>{16, 32, 64, 128, 192});  // the last try is the limit itself
  Device small{10};
  CHECK_THAT(hetseq::test::error_of<hetseq::InputError>([&] { probe(small, 16, 192); }),
             Catch::Contains("--max-sentences 16: one micro-batch of that size runs out of device memory"));
}
