#include "shardfeed/base/file_io.h"

#include <unistd.h>

#include <cerrno>

namespace shardfeed {

int WriteAll(int fd, const void* data, size_t size, off_t offset) {
  const char* p = static_cast<const char*>(data);
  size_t done = 0;
  while (done < size) {
    const ssize_t n = offset >= 0 ? ::pwrite(fd, p + done, size - done, offset + off_t(done))
                                  : ::write(fd, p + done, size - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno ? errno : EIO;
    if (n == 0) return EIO;
    done += static_cast<size_t>(n);
  }
  return 0;
}

}  // namespace shardfeed
