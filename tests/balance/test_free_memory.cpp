// The default of --memory-budget: the free memory that a rank reads for itself.
#include <catch2/catch.hpp>

#include <fstream>
#include <string>

#include <torch/torch.h>

#include "hetseq/balance/free_memory.h"

TEST_CASE("mem_available reads MemAvailable of /proc/meminfo in bytes", "[zero_shard][memory]") {
  const std::string meminfo =
      "MemTotal:       16384000 kB\nMemFree:         1000000 kB\nMemAvailable:    8000000 kB\nBuffers: 1 kB\n";
  CHECK(hetseq::detail::mem_available(meminfo) == std::optional<int64_t>(8000000LL * 1024));
  CHECK_FALSE(hetseq::detail::mem_available("MemTotal: 1 kB\n").has_value());
}

TEST_CASE("free_memory_bytes on the CPU is positive and at most MemTotal", "[zero_shard][memory]") {
  const int64_t free = hetseq::free_memory_bytes(torch::kCPU);
  std::ifstream meminfo("/proc/meminfo");
  std::string name, unit;
  int64_t total_kb = 0;
  while (meminfo >> name >> total_kb >> unit && name != "MemTotal:") {
  }
  REQUIRE(name == "MemTotal:");
  REQUIRE(unit == "kB");
  CHECK(free > 0);
  CHECK(free <= total_kb * 1024);
}
