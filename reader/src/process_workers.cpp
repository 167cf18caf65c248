// Worker processes: forked at Create(), each decodes into a ring that lives in a memfd mapping
// shared with the parent (no /dev/shm entry, so nothing is left behind after a crash, and
// Docker's 64 MB /dev/shm limit does not apply). A parent thread per child hands it one task at
// a time over a socketpair; a closed socket means the child died, which becomes an error.
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "loader_internal.h"

namespace shardfeed::reader {
namespace {

struct WireTask {
  int32_t slot;
  uint32_t position;
  uint64_t index;
  uint64_t seed;
};

struct WireResult {
  int32_t code;
  uint32_t message_size;
  double read, decode, resize;
};

bool SendAll(int fd, const void* data, size_t size) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    ssize_t n = ::send(fd, p, size, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

bool RecvAll(int fd, void* data, size_t size) {
  char* p = static_cast<char*>(data);
  while (size > 0) {
    ssize_t n = ::recv(fd, p, size, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

[[noreturn]] void ChildMain(Loader::Impl* p, int fd) {
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the parent
  SampleDecoder decoder(p->archive, p->options.transform);
  WireTask task;
  while (RecvAll(fd, &task, sizeof(task))) {
    StageTimes times;
    uint8_t* dst = p->SlotImages(task.slot) + size_t{task.position} * p->sample_bytes;
    Status s = decoder.DecodeInto(task.index, task.seed, dst, &times);
    WireResult r{static_cast<int32_t>(s.code()), static_cast<uint32_t>(s.message().size()),
                 times.read, times.decode, times.resize};
    if (!SendAll(fd, &r, sizeof(r)) || !SendAll(fd, s.message().data(), s.message().size())) break;
  }
  ::_exit(0);
}

std::string DescribeExit(pid_t pid) {
  int status = 0;
  pid_t r = ::waitpid(pid, &status, 0);
  if (r != pid) return "exited";
  if (WIFSIGNALED(status)) {
    return std::string("was killed by signal ") + std::to_string(WTERMSIG(status)) + " (" +
           strsignal(WTERMSIG(status)) + ")";
  }
  return "exited with status " + std::to_string(WEXITSTATUS(status));
}

}  // namespace

Status Loader::Impl::StartProcesses() {
  const size_t bytes = slot_bytes * slots.size();
  int fd = ::memfd_create("shardfeed-ring", MFD_CLOEXEC);
  if (fd < 0) return Status::IOError("memfd_create: ", std::strerror(errno));
  if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    int err = errno;
    ::close(fd);
    return Status::IOError("ftruncate of the shared ring (", bytes,
                           " bytes): ", std::strerror(err));
  }
  void* map = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (map == MAP_FAILED) return Status::IOError("mmap of the shared ring: ", std::strerror(errno));
  shared_map = map;
  shared_size = bytes;
  std::memset(map, 0, bytes);  // allocate and touch once, before the children share it
  ring_base = static_cast<uint8_t*>(map);

  for (int w = 0; w < options.workers; ++w) {
    int sv[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
      return Status::IOError("socketpair: ", std::strerror(errno));
    }
    pid_t pid = ::fork();
    if (pid < 0) {
      int err = errno;
      ::close(sv[0]);
      ::close(sv[1]);
      return Status::IOError("fork: ", std::strerror(err));
    }
    if (pid == 0) {
      ::close(sv[0]);
      for (const Child& c : children) ::close(c.task_fd);
      ChildMain(this, sv[1]);
    }
    ::close(sv[1]);
    children.push_back(Child{pid, sv[0], sv[0]});
  }
  ring = PinnedBuffer::Adopt(map, bytes);  // after fork: children never touch CUDA
  for (size_t c = 0; c < children.size(); ++c) {
    threads.emplace_back([this, c] { DispatchTo(c); });
  }
  return Status::OK();
}

void Loader::Impl::DispatchTo(size_t c) {
  const Child child = children[c];
  Task task;
  std::string message;
  while (Claim(&task)) {
    StageTimes prefetch_time;
    IssuePrefetch(&task, &prefetch_time);  // the mapping is shared: the parent's advice counts
    WireTask wt{task.slot, task.position, task.index, task.seed};
    WireResult r{};
    bool alive = SendAll(child.task_fd, &wt, sizeof(wt)) && RecvAll(child.result_fd, &r, sizeof(r));
    if (alive) {
      message.resize(r.message_size);
      alive = RecvAll(child.result_fd, message.data(), message.size());
    }
    if (!alive) {
      Status dead = Status::IOError("worker process ", child.pid, " ", DescribeExit(child.pid),
                                    " while decoding sample ", task.index, " of ", archive->path());
      Complete(task, dead, StageTimes());
      {
        std::lock_guard<std::mutex> lock(mu);
        if (fatal.ok()) fatal = dead;
      }
      cv_ready.notify_all();
      return;
    }
    StageTimes times;
    times.read = r.read;
    times.decode = r.decode;
    times.resize = r.resize;
    Complete(task, r.code == 0 ? Status::OK() : Status(static_cast<StatusCode>(r.code), message),
             times);
  }
}

void Loader::Impl::StopWorkers() {
  // Dispatchers leave Claim() once `stopping` is set; closing the sockets ends the children.
  for (auto& t : threads) {
    if (t.joinable()) t.join();
  }
  threads.clear();
  for (Child& c : children) {
    if (c.task_fd >= 0) ::close(c.task_fd);
    c.task_fd = c.result_fd = -1;
  }
  for (Child& c : children) {
    if (c.pid > 0) {
      int status;
      while (::waitpid(c.pid, &status, 0) < 0 && errno == EINTR) {
      }
      c.pid = -1;
    }
  }
  children.clear();
}

Loader::Impl::~Impl() {
  Shutdown();
  ring = PinnedBuffer();
  if (shared_map) ::munmap(shared_map, shared_size);
}

}  // namespace shardfeed::reader
