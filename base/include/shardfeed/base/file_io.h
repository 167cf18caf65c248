// Writing whole buffers to file descriptors: the one loop every writer of small files (reports,
// stats records, extracted images) and file copies use.
#pragma once

#include <sys/types.h>

#include <cstddef>

namespace shardfeed {

// Writes all `size` bytes of `data` to `fd` (at `offset` with pwrite when offset >= 0, else at
// the file position), retrying short writes and EINTR. Returns 0, or the errno of the failure
// (EIO for a write that made no progress without one). The caller owns `fd` and closes it.
// Thread-safe for distinct fds, and for one fd with offsets that do not overlap.
int WriteAll(int fd, const void* data, size_t size, off_t offset = -1);

}  // namespace shardfeed
