// How many CPUs (and how much memory) this process may use: what `workers=0` ("all cores") means
// for the loader and the packer. Not the machine's core count: a container's CPU quota (cgroup v2
// cpu.max, v1 cpu.cfs_quota_us / cpu.cfs_period_us) and the process's affinity mask (taskset,
// sched_setaffinity, Slurm's binding) both bound it, or workers oversubscribe the CPUs they
// have and every one of them runs slower.
#pragma once

#include <cstdint>
#include <string_view>

namespace shardfeed {

// min(affinity mask size, ceil(cgroup quota / period)), at least 1. Cheap; read each call.
int AvailableCpus();
// The CPUs a cgroup v2 "cpu.max" line allows ("150000 100000" -> 2, rounded up); 0 when it
// sets no limit ("max 100000") or cannot be read.
int CpusFromCgroupMax(std::string_view cpu_max);

// The memory this process may use: physical memory, bounded by a cgroup v2 memory.max or v1
// memory.limit_in_bytes when one is set. What prefetch="auto" sizes its ring budget from.
uint64_t AvailableMemoryBytes();
// A cgroup v2 "memory.max" (or v1 limit) line in bytes; 0 when it sets no limit ("max").
uint64_t BytesFromCgroupLimit(std::string_view limit);

}  // namespace shardfeed
