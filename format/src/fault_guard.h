// Shard mappings that survive their file being truncated underneath them. Private to format/.
//
// A mapped file that another process truncates makes every later read past its new end raise
// SIGBUS, which would kill the reader (a training job, `shardfeed verify`). Each shard's mapped
// range is registered here; a SIGBUS whose address lies in a registered range is answered by
// mapping zero pages over the rest of that range and marking it faulted, so the read completes
// (with zeros) and the caller, checking Faulted() after its reads, turns the sample into an
// error naming the shard. Any other SIGBUS goes to the handler installed before ours (or the
// default action), as if this one were not there.
//
// Thread-safety: Guard/Unguard/Faulted from any thread; the handler is async-signal-safe (it
// reads atomics and calls mmap). Unguard() before unmapping the range. At most kMaxGuarded
// ranges at once; beyond that Guard() returns -1 and the range is unguarded (as before).
#pragma once

#include <cstddef>

namespace shardfeed::format::internal {

inline constexpr int kMaxGuarded = 4096;

int GuardRange(const void* begin, size_t size);  // an id, or -1
void UnguardRange(int id);
bool RangeFaulted(int id);
// False until the handler has answered a SIGBUS in any range: the per-sample check's fast path.
bool AnyFaulted();
// Tests only: `hook` runs in the handler right after the zero pages are mapped (the moment
// another thread can read them without a fault); nullptr removes it. Async-signal-safe hooks only.
void SetAfterRemapHookForTest(void (*hook)());

}  // namespace shardfeed::format::internal
