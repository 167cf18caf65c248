#include "shardfeed/base/cpus.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

namespace shardfeed {
namespace {

std::string ReadSmallFile(const char* path) {
  std::ifstream in(path);
  std::string text;
  std::getline(in, text);
  return text;
}

int CpusFromQuota(long long quota, long long period) {
  if (quota <= 0 || period <= 0) return 0;
  return static_cast<int>((quota + period - 1) / period);
}

}  // namespace

int CpusFromCgroupMax(std::string_view cpu_max) {
  std::istringstream in{std::string(cpu_max)};
  std::string quota;
  long long period = 0;
  if (!(in >> quota >> period) || quota == "max") return 0;
  char* end = nullptr;
  const long long q = std::strtoll(quota.c_str(), &end, 10);
  if (end == quota.c_str() || *end != 0) return 0;
  return CpusFromQuota(q, period);
}

int AvailableCpus() {
  int n = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) n = std::max(1, CPU_COUNT(&set));
  int quota = CpusFromCgroupMax(ReadSmallFile("/sys/fs/cgroup/cpu.max"));  // cgroup v2
  if (quota == 0) {                                                        // cgroup v1
    const std::string q = ReadSmallFile("/sys/fs/cgroup/cpu/cpu.cfs_quota_us");
    const std::string p = ReadSmallFile("/sys/fs/cgroup/cpu/cpu.cfs_period_us");
    if (!q.empty() && !p.empty())
      quota = CpusFromQuota(std::atoll(q.c_str()), std::atoll(p.c_str()));
  }
  if (quota > 0) n = std::min(n, quota);
  return std::max(1, n);
}

uint64_t BytesFromCgroupLimit(std::string_view limit) {
  std::string text(limit);
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  if (text.empty() || text == "max") return 0;
  char* end = nullptr;
  const unsigned long long v = std::strtoull(text.c_str(), &end, 10);
  if (end == text.c_str() || *end != 0) return 0;
  return v;
}

uint64_t AvailableMemoryBytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  uint64_t bytes = pages > 0 && page > 0 ? uint64_t(pages) * uint64_t(page) : uint64_t{1} << 32;
  for (const char* path :
       {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) {
    const uint64_t limit = BytesFromCgroupLimit(ReadSmallFile(path));
    if (limit > 0) bytes = std::min(bytes, limit);  // v1's "no limit" is a huge number: min
  }
  return bytes;
}

}  // namespace shardfeed
