// workers=0 means the CPUs this process may use, not the machine's cores.
#include "shardfeed/base/cpus.h"

#include <sched.h>
#include <unistd.h>

#include <thread>

#include "test_util.h"

namespace shardfeed {
namespace {

TEST_CASE("a cgroup v2 cpu.max line gives the CPUs it allows, rounded up") {
  CHECK(CpusFromCgroupMax("max 100000") == 0);
  CHECK(CpusFromCgroupMax("100000 100000") == 1);
  CHECK(CpusFromCgroupMax("150000 100000") == 2);
  CHECK(CpusFromCgroupMax("50000 100000") == 1);
  CHECK(CpusFromCgroupMax("400000 100000") == 4);
  CHECK(CpusFromCgroupMax("") == 0);
  CHECK(CpusFromCgroupMax("garbage") == 0);
  CHECK(CpusFromCgroupMax("12x 100000") == 0);
}

TEST_CASE("the affinity mask bounds the CPUs available") {
  REQUIRE(AvailableCpus() >= 1);
  // In a thread of its own (affinity is per thread): pinned to one CPU, one is available.
  int seen = 0;
  std::thread([&] {
    cpu_set_t one;
    CPU_ZERO(&one);
    cpu_set_t mine;
    REQUIRE(sched_getaffinity(0, sizeof(mine), &mine) == 0);
    for (int c = 0; c < CPU_SETSIZE; ++c) {
      if (CPU_ISSET(c, &mine)) {
        CPU_SET(c, &one);
        break;
      }
    }
    REQUIRE(sched_setaffinity(0, sizeof(one), &one) == 0);
    seen = AvailableCpus();
  }).join();
  CHECK(seen == 1);
}

TEST_CASE("a cgroup memory limit is read in bytes; 'max' or garbage is no limit") {
  CHECK(BytesFromCgroupLimit("8589934592") == 8589934592ull);
  CHECK(BytesFromCgroupLimit("8589934592\n") == 8589934592ull);
  CHECK(BytesFromCgroupLimit("max") == 0);
  CHECK(BytesFromCgroupLimit("") == 0);
  CHECK(BytesFromCgroupLimit("12x") == 0);
  const uint64_t mem = AvailableMemoryBytes();
  CHECK(mem > (uint64_t{64} << 20));  // this machine's memory, or its container's limit
  CHECK(mem <= uint64_t(sysconf(_SC_PHYS_PAGES)) * uint64_t(sysconf(_SC_PAGESIZE)));
}

}  // namespace
}  // namespace shardfeed
