// WriteAll: every byte, at the file position or at an offset, and the errno of a failure.
#include "shardfeed/base/file_io.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <string>

#include "test_util.h"

namespace shardfeed {
namespace {

std::string ReadAll(int fd) {
  std::string out(1 << 20, '\0');
  const ssize_t n = ::pread(fd, out.data(), out.size(), 0);
  out.resize(n > 0 ? size_t(n) : 0);
  return out;
}

TEST_CASE("WriteAll writes every byte, at the position or at offsets") {
  char name[] = "/tmp/shardfeed-write-all-XXXXXX";
  const int fd = ::mkstemp(name);
  REQUIRE(fd >= 0);
  ::unlink(name);
  std::string big(300000, 'x');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>('a' + i % 26);
  CHECK(WriteAll(fd, big.data(), big.size()) == 0);
  CHECK(WriteAll(fd, "!", 1) == 0);  // appended at the position
  CHECK(ReadAll(fd) == big + "!");
  CHECK(WriteAll(fd, "XY", 2, 5) == 0);  // in place, the position unchanged
  std::string want = big + "!";
  want[5] = 'X';
  want[6] = 'Y';
  CHECK(ReadAll(fd) == want);
  CHECK(::lseek(fd, 0, SEEK_CUR) == off_t(big.size() + 1));
  CHECK(WriteAll(fd, "", 0) == 0);
  ::close(fd);
}

TEST_CASE("WriteAll returns the errno of a failed write") {
  CHECK(WriteAll(-1, "x", 1) == EBADF);
  const int ro = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  REQUIRE(ro >= 0);
  CHECK(WriteAll(ro, "x", 1) == EBADF);
  ::close(ro);
  // A pipe whose reader is gone: EPIPE (SIGPIPE ignored for the check).
  int p[2];
  REQUIRE(::pipe(p) == 0);
  ::close(p[0]);
  auto old = std::signal(SIGPIPE, SIG_IGN);
  CHECK(WriteAll(p[1], "x", 1) == EPIPE);
  std::signal(SIGPIPE, old);
  ::close(p[1]);
}

}  // namespace
}  // namespace shardfeed
