// Worker processes. Each is a fresh `shardfeed-worker` program started with posix_spawn, never
// a fork() of the (possibly heavily threaded) host: a fork copies locks other threads held and
// runs atfork handlers of every library loaded, which is how DataLoader-style workers deadlock.
// A worker gets two descriptors: a socket to its dispatcher thread in the parent (fd 3) and the
// memfd holding the ring (fd 4), which both map; no /dev/shm entry exists, so nothing is left
// behind after a crash and Docker's 64 MB /dev/shm limit does not apply. It opens the archive
// itself, then decodes one task at a time. It exits when the socket closes or when its parent
// process is gone (getppid() changes), whatever thread started it.
#include <dlfcn.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <thread>

#include "loader_internal.h"

extern char** environ;

namespace shardfeed::reader {
namespace {

constexpr int kSocketFd = 3, kRingFd = 4;
constexpr uint32_t kWireMagic = 0x4b574653;  // "SFWK"
constexpr uint32_t kWireVersion = 3;

// Sent once by the parent after spawning. Same build on both sides (the worker program is found
// beside the library), checked by version, the struct sizes and the build string.
struct WireConfig {
  uint32_t magic, version, transform_bytes, build_bytes;
  uint64_t ring_bytes, sample_bytes, sample_count;
  int32_t parent_pid;
  uint32_t path_bytes;
  // The identity of the archive the loader opened: XXH3 of its manifest, which names every
  // shard's content hash. A worker reopens the archive by its path and refuses another one.
  uint64_t manifest_hash;
  // Fields (batch_fields.h): the schema fields selected, and the slot layout the worker must
  // arrive at from them (checked).
  uint64_t fields;
  uint64_t slot_bytes;
  uint32_t batch_size;
  uint32_t reserved;
};

uint64_t ManifestHash(const format::Archive& archive) {
  const std::string json = archive.manifest().ToJson();
  return format::RecordChecksum(json.data(), json.size());
}

// A worker found another archive at `path` than the loader's.
Status NotTheArchive(const std::string& path) {
  std::error_code ec;
  const std::string cwd = std::filesystem::current_path(ec).string();
  return Status::Corrupt(
      path, ": the worker process found another archive there than the archive this loader opened",
      path.empty() || path[0] != '/' ? " (a relative path, resolved in " + cwd + ")" : "",
      ": it was replaced on disk, or the working directory changed, since it was opened; open "
      "it again (by an absolute path) and create the loader from that");
}

struct WireTask {
  int32_t slot;
  uint32_t position;
  uint64_t index;
  uint64_t seed;
  uint64_t offset;  // of the sample's bytes in the ring
};

struct WireResult {
  int32_t code;
  uint32_t message_size;
  double read, decode, resize;
};

const char* BuildString() { return SHARDFEED_VERSION " " __DATE__ " " __TIME__; }

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

bool SendResult(int fd, const Status& s, const StageTimes& times) {
  const std::string& m = s.message();
  WireResult r{static_cast<int32_t>(s.code()), static_cast<uint32_t>(m.size()), times.read,
               times.decode, times.resize};
  return SendAll(fd, &r, sizeof(r)) && SendAll(fd, m.data(), m.size());
}

// Waits until `fd` is readable; false when the parent process is gone.
bool WaitForParent(int fd, pid_t parent) {
  for (;;) {
    pollfd pfd{fd, POLLIN, 0};
    int r = ::poll(&pfd, 1, 500);
    if (r > 0) return true;
    if (r < 0 && errno != EINTR) return false;
    if (::getppid() != parent) return false;
  }
}

// Where the worker program is: $SHARDFEED_WORKER, beside the binary or shared object holding
// this code (the CLI, the Python extension), beside the running program, on PATH (an installed
// prefix's bin), or where this build put it.
Result<std::string> WorkerProgram() {
  namespace fs = std::filesystem;
  std::vector<std::string> tried;
  auto usable = [&](const std::string& path) {
    tried.push_back(path);
    return ::access(path.c_str(), X_OK) == 0;
  };
  if (const char* env = std::getenv("SHARDFEED_WORKER"); env && *env) {
    if (usable(env)) return std::string(env);
    return Status::NotFound("SHARDFEED_WORKER=", env, " is not an executable program");
  }
  Dl_info info;
  if (::dladdr(reinterpret_cast<void*>(&WorkerProgram), &info) && info.dli_fname) {
    std::error_code ec;
    fs::path self = fs::canonical(info.dli_fname, ec);
    if (!ec) {
      std::string candidate = (self.parent_path() / "shardfeed-worker").string();
      if (usable(candidate)) return candidate;
    }
  }
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    std::string candidate = (exe.parent_path() / "shardfeed-worker").string();
    if (usable(candidate)) return candidate;
  }
  // An installed shardfeed (cmake --install, pip): its bin directory is on PATH.
  if (const char* path = std::getenv("PATH"); path && *path) {
    std::string dirs(path);
    for (size_t start = 0; start <= dirs.size();) {
      size_t end = dirs.find(':', start);
      if (end == std::string::npos) end = dirs.size();
      if (end > start && dirs[start] == '/') {
        std::string candidate = dirs.substr(start, end - start) + "/shardfeed-worker";
        if (usable(candidate)) return candidate;
      }
      start = end + 1;
    }
  }
#ifdef SHARDFEED_WORKER_BUILD_PATH
  if (usable(SHARDFEED_WORKER_BUILD_PATH)) return std::string(SHARDFEED_WORKER_BUILD_PATH);
#endif
  std::string where;
  for (const auto& t : tried) where += (where.empty() ? "" : ", ") + t;
  return Status::NotFound("worker processes need the shardfeed-worker program; not found at ",
                          where, " (set SHARDFEED_WORKER)");
}

// Describes how a worker that closed its socket ended, without reaping it (StopWorkers reaps).
std::string DescribeExit(pid_t pid) {
  siginfo_t info{};
  for (int i = 0; i < 100; ++i) {  // at most ~1 s: it closed its socket, so it is exiting
    info.si_pid = 0;
    if (::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT) != 0) break;
    if (info.si_pid == pid) {
      if (info.si_code == CLD_KILLED || info.si_code == CLD_DUMPED) {
        return std::string("was killed by signal ") + std::to_string(info.si_status) + " (" +
               strsignal(info.si_status) + ")";
      }
      return "exited with status " + std::to_string(info.si_status);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return "closed its connection";
}

// A descriptor numbered above the ones the child will receive, so dup2 in the child never
// maps a descriptor onto itself (which would keep its close-on-exec flag).
Result<int> HighCopy(int fd) {
  int copy = ::fcntl(fd, F_DUPFD_CLOEXEC, 10);
  if (copy < 0) return Status::IOError("fcntl(F_DUPFD): ", std::strerror(errno));
  return copy;
}

// This process's environment, with a remote archive's cache options (cache_dir, cache_limit as
// the loader's archive resolved them) as SHARDFEED_CACHE_DIR / SHARDFEED_CACHE_LIMIT, so the
// worker processes read through the same cache.
std::vector<std::string> WorkerEnvironment(const format::Archive& archive) {
  std::vector<std::string> env;
  const storage::Remote* remote = archive.remote();
  for (char** e = environ; *e; ++e) {
    const std::string_view v(*e);
    if (remote &&
        (v.rfind("SHARDFEED_CACHE_DIR=", 0) == 0 || v.rfind("SHARDFEED_CACHE_LIMIT=", 0) == 0)) {
      continue;
    }
    env.emplace_back(v);
  }
  if (remote) {
    env.push_back("SHARDFEED_CACHE_DIR=" + remote->cache_dir());
    if (remote->cache_limit()) {
      env.push_back("SHARDFEED_CACHE_LIMIT=" + std::to_string(remote->cache_limit()));
    }
  }
  return env;
}

// Starts the worker program with `sock` as its descriptor 3 and `ring` as 4, in environment
// `env`.
Result<pid_t> Spawn(const std::string& program, int sock, int ring,
                    const std::vector<std::string>& env) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, sock, kSocketFd);
  posix_spawn_file_actions_adddup2(&actions, ring, kRingFd);
  // Workers ignore Ctrl-C: the terminal sends SIGINT to the whole process group, and the
  // parent decides (KeyboardInterrupt); they end when the parent closes their socket.
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK);
  char arg0[] = "shardfeed-worker";
  char* argv[] = {arg0, nullptr};
  std::vector<char*> envp;
  for (const std::string& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  pid_t pid = -1;
  int rc = ::posix_spawn(&pid, program.c_str(), &actions, &attr, argv, envp.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) return Status::IOError("posix_spawn ", program, ": ", std::strerror(rc));
  return pid;
}

// Loaders whose ring is a shared memfd mapping (processes mode), for the fork handler: a child
// made with fork() (multiprocessing's "fork", os.fork) inherits that mapping MAP_SHARED, so a
// batch it holds would change when the parent's loader reuses the slot, and the child's writes
// to it would reach the parent. In the child, each slot leased at the fork becomes a private
// copy, as a private ring (threads mode) is by copy-on-write. Its cost: a fork() of a process
// holding batches of a processes-mode loader copies them (their memory again, and about
// 100 ms per 100 MB, measured), once per child; the child's own forks copy nothing more (its
// registry is emptied).
//
// Locks: the registry's lock, then every registered loader's `mu` (nothing takes them in the
// other order), are held from prepare until the child has its copies: no thread of the parent
// can release a leased slot, and so no worker can write into it, while the child copies it.
// The parent's fork() returns when the child says so through a pipe, or after kForkCopyWaitMs
// (a note on stderr). Registered by StartProcesses, removed first thing by ~Impl.
std::mutex& SharedRingsMutex() {
  static auto* mu = new std::mutex;  // leaked: atfork handlers may run during exit
  return *mu;
}
std::vector<Loader::Impl*>& SharedRings() {
  static auto* rings = new std::vector<Loader::Impl*>;
  return *rings;
}

void Note(const char* text) {  // async-signal-safe: the child handler's one way to speak
  [[maybe_unused]] const ssize_t n = ::write(STDERR_FILENO, text, std::strlen(text));
}

// Replaces [p, p + bytes) (page-aligned, part of a shared mapping) with a private copy of its
// present contents. On failure (no memory) the range stays shared, said on stderr.
void MakePrivate(uint8_t* p, size_t bytes) {
  void* copy = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (copy != MAP_FAILED) {
    std::memcpy(copy, p, bytes);
    if (::mremap(copy, bytes, bytes, MREMAP_MAYMOVE | MREMAP_FIXED, p) != MAP_FAILED) return;
    ::munmap(copy, bytes);
  }
  Note(
      "shardfeed: warning: a forked child could not copy a batch it holds (no memory): it "
      "shares it with the parent's loader, which will reuse it\n");
}

// The child tells the parent through this pipe that it has its copies.
int g_fork_pipe[2] = {-1, -1};
constexpr int kForkCopyWaitMs = 10000;  // the bound on that wait (a copy takes milliseconds)

void ForkPrepare() {
  SharedRingsMutex().lock();
  for (Loader::Impl* impl : SharedRings()) impl->mu.lock();
  g_fork_pipe[0] = g_fork_pipe[1] = -1;
  if (!SharedRings().empty() && ::pipe2(g_fork_pipe, O_CLOEXEC) != 0) {
    g_fork_pipe[0] = g_fork_pipe[1] = -1;
    Note(
        "shardfeed: warning: fork() without waiting for the child to copy the batches it "
        "holds (no pipe: too many open files?)\n");
  }
}
void Unlock() {
  for (Loader::Impl* impl : SharedRings()) impl->mu.unlock();
  SharedRingsMutex().unlock();
}
void ForkParent() {
  if (g_fork_pipe[0] >= 0) {
    // Returns when the child writes or exits (or, fork having failed, at once: no writer).
    ::close(g_fork_pipe[1]);
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::milliseconds(kForkCopyWaitMs);
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                            deadline - std::chrono::steady_clock::now())
                            .count();
      pollfd p{g_fork_pipe[0], POLLIN, 0};
      const int r = left > 0 ? ::poll(&p, 1, static_cast<int>(left)) : 0;
      if (r == 0) {
        Note(
            "shardfeed: warning: a forked child did not copy the batches it holds within 10 s "
            "(stopped?): the loader goes on, and may reuse them under it\n");
      }
      if (r >= 0 || errno != EINTR) break;
    }
    ::close(g_fork_pipe[0]);
  }
  Unlock();
}
void ForkChild() {
  // One thread now, every loader's lock held (prepare): the slot states are as the fork found
  // them, none half changed.
  for (Loader::Impl* impl : SharedRings()) {
    for (size_t s = 0; s < impl->slots.size(); ++s) {
      if (impl->slots[s].state == SlotState::kLeased && impl->ring.committed(s)) {
        MakePrivate(impl->ring.data() + s * impl->ring.slot_bytes(), impl->ring.slot_bytes());
      }
    }
  }
  if (g_fork_pipe[0] >= 0) {
    ::close(g_fork_pipe[0]);
    const char done = 1;
    [[maybe_unused]] const ssize_t n = ::write(g_fork_pipe[1], &done, 1);
    ::close(g_fork_pipe[1]);
  }
  Unlock();
  // The copies are the child's own memory now, which its own forks copy on write; the forked
  // copies of the loaders are inert (they never lease again).
  SharedRings().clear();
}

void RegisterSharedRing(Loader::Impl* impl) {
  static std::once_flag handlers;
  std::call_once(handlers, [] { ::pthread_atfork(ForkPrepare, ForkParent, ForkChild); });
  std::lock_guard<std::mutex> lock(SharedRingsMutex());
  SharedRings().push_back(impl);
}

}  // namespace

void Loader::Impl::ForgetSharedRing() {
  std::lock_guard<std::mutex> lock(SharedRingsMutex());
  auto& rings = SharedRings();
  rings.erase(std::remove(rings.begin(), rings.end(), this), rings.end());
}

Status Loader::Impl::StartProcesses() {
  const size_t bytes = layout.slot_bytes * slots.size();
  int memfd = ::memfd_create("shardfeed-ring", MFD_CLOEXEC);
  if (memfd < 0) return Status::IOError("memfd_create: ", std::strerror(errno));
  struct FdCloser {
    int fd;
    ~FdCloser() {
      if (fd >= 0) ::close(fd);
    }
  } memfd_closer{memfd};
  if (::ftruncate(memfd, static_cast<off_t>(bytes)) != 0) {
    return Status::IOError("ftruncate of the shared ring (", bytes,
                           " bytes): ", std::strerror(errno));
  }
  // Reserved, not touched: the loader commits slots (MaintainRing) as its depth needs them.
  SF_ASSIGN_OR_RETURN(ring, RingMemory::Reserve(layout.slot_bytes, slots.size(), memfd));
  ring_base = ring.data();
  RegisterSharedRing(this);
  SF_ASSIGN_OR_RETURN(std::string program, WorkerProgram());
  SF_ASSIGN_OR_RETURN(int ring_copy, HighCopy(memfd));
  FdCloser ring_copy_closer{ring_copy};

  const std::string build = BuildString();
  const std::string& path = archive->path();
  const uint64_t manifest_hash = ManifestHash(*archive);
  const std::vector<std::string> env = WorkerEnvironment(*archive);
  for (int w = 0; w < options.workers; ++w) {
    int sv[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
      return Status::IOError("socketpair: ", std::strerror(errno));
    }
    FdCloser child_end{sv[1]};
    children.push_back(Child{-1, sv[0]});
    SF_ASSIGN_OR_RETURN(int sock_copy, HighCopy(sv[1]));
    FdCloser sock_copy_closer{sock_copy};
    SF_ASSIGN_OR_RETURN(pid_t pid, Spawn(program, sock_copy, ring_copy, env));
    children.back().pid = pid;

    WireConfig cfg{kWireMagic,
                   kWireVersion,
                   static_cast<uint32_t>(sizeof(TransformOptions)),
                   static_cast<uint32_t>(build.size()),
                   bytes,
                   layout.sample_bytes,
                   archive->size(),
                   static_cast<int32_t>(::getpid()),
                   static_cast<uint32_t>(path.size()),
                   manifest_hash,
                   fields.selected,
                   layout.slot_bytes,
                   options.batch_size,
                   0};
    WireResult hello{};
    std::string message;
    bool ok = SendAll(sv[0], &cfg, sizeof(cfg)) &&
              SendAll(sv[0], &options.transform, sizeof(TransformOptions)) &&
              SendAll(sv[0], build.data(), build.size()) &&
              SendAll(sv[0], path.data(), path.size());
    // The worker opens the archive before it answers: bounded like every wait of the loader.
    if (ok && options.timeout > 0) {
      pollfd pfd{sv[0], POLLIN, 0};
      int r;
      do {
        r = ::poll(&pfd, 1, static_cast<int>(options.timeout * 1000));
      } while (r < 0 && errno == EINTR);
      if (r == 0) {
        return Status::Timeout("worker process ", pid, " (", program, ") did not start within ",
                               options.timeout, " s (opening ", path, ")");
      }
    }
    ok = ok && RecvAll(sv[0], &hello, sizeof(hello));
    if (ok) {
      message.resize(hello.message_size);
      ok = RecvAll(sv[0], message.data(), message.size());
    }
    if (!ok)
      return Status::IOError("worker process ", pid, " (", program, ") ", DescribeExit(pid),
                             " while starting");
    if (hello.code != 0) {
      return Status(static_cast<StatusCode>(hello.code),
                    "worker process " + std::to_string(pid) + ": " + message);
    }
  }
  progress.resize(children.size());
  holding.reset(new std::atomic<uint64_t>[progress.size()]());
  for (size_t c = 0; c < children.size(); ++c) {
    try {
      threads.emplace_back([this, c] { DispatchTo(c); });
    } catch (const std::exception& e) {  // the Impl's destructor stops what was started
      return Status::ResourceExhausted("cannot start the dispatcher thread of worker process ", c,
                                       ": ", e.what());
    }
  }
  return Status::OK();
}

void Loader::Impl::DispatchTo(size_t c) {
  const Child child = children[c];
  Task run;
  std::string message;
  try {
    while (Claim(c, &run)) {
      RunTally tally;
      IssuePrefetch(&run, &tally.total);  // the mapping is shared: the parent's advice counts
      Task t = run;
      for (uint32_t i = 0; i < run.count; ++i) {  // one sample per message
        t.k = run.k + i;
        t.position = run.position + i;
        holding[c].store(t.k, std::memory_order_relaxed);
        Resolve(&t);
        WireTask wt{t.slot, t.position, t.index, t.seed,
                    static_cast<uint64_t>(SlotImages(t.slot) - ring_base) +
                        uint64_t{t.position} * layout.sample_bytes};
        WireResult r{};
        bool alive = SendAll(child.fd, &wt, sizeof(wt)) && RecvAll(child.fd, &r, sizeof(r));
        if (alive) {
          message.resize(r.message_size);
          alive = RecvAll(child.fd, message.data(), message.size());
        }
        if (!alive) {
          bool shutting_down;
          {
            std::lock_guard<std::mutex> lock(mu);
            shutting_down = stopping;
          }
          Status dead =
              shutting_down
                  ? Status::Cancelled("loader is shutting down")
                  : Status::IOError("worker process ", child.pid, " ", DescribeExit(child.pid),
                                    " while decoding sample ", t.index, " of ", archive->path());
          SetFatal(dead);  // before the run completes: no later Next() may succeed
          tally.failures = run.count;
          tally.first_error = dead;
          FinishRun(c, run, tally);
          return;
        }
        StageTimes times;
        times.read = r.read;
        times.decode = r.decode;
        times.resize = r.resize;
        Status s = r.code == 0 ? Status::OK() : Status(static_cast<StatusCode>(r.code), message);
        SampleDone(t, s, times, &tally);
      }
      FinishRun(c, run, tally);
    }
  } catch (const std::exception& e) {
    SetFatal(Status::Internal("dispatcher of worker process ", child.pid, ": ", e.what()));
  } catch (...) {
    SetFatal(Status::Internal("dispatcher of worker process ", child.pid, ": unknown exception"));
  }
}

void Loader::Impl::StopWorkers() {
  if (children.empty()) return StopThreads();  // thread mode
  // Wake dispatchers blocked on their worker (a stuck or stopped process) and tell healthy
  // workers to exit: both ends of each socket see EOF.
  for (Child& c : children) {
    if (c.fd >= 0) ::shutdown(c.fd, SHUT_RDWR);
  }
  for (auto& t : threads) {
    if (t.joinable()) t.join();
  }
  threads.clear();
  for (Child& c : children) {
    if (c.fd >= 0) ::close(c.fd);
    c.fd = -1;
  }
  // Reap within a bound: a grace period to exit on EOF, then SIGKILL (which also ends a
  // stopped process), so no zombie and no orphan is left.
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::duration<double>(kShutdownGrace);
  for (;;) {
    bool running = false;
    for (Child& c : children) {
      if (c.pid <= 0) continue;
      int status;
      pid_t r = ::waitpid(c.pid, &status, WNOHANG);
      if (r == c.pid || (r < 0 && errno == ECHILD)) {
        c.pid = -1;
      } else {
        running = true;
      }
    }
    if (!running) break;
    if (std::chrono::steady_clock::now() >= deadline) {
      for (Child& c : children) {
        if (c.pid <= 0) continue;
        ::kill(c.pid, SIGKILL);
        int status;
        while (::waitpid(c.pid, &status, 0) < 0 && errno == EINTR) {
        }
        c.pid = -1;
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  children.clear();
}

Loader::Impl::~Impl() {
  ForgetSharedRing();
  if (!InOwnerProcess()) {
    // The last lease of a forked copy: threads, CUDA memory and worker processes are the
    // parent's. Leak them rather than join, free or signal anything.
    new std::vector<std::thread>(std::move(threads));
    new RingMemory(std::move(ring));
    new std::vector<std::unique_ptr<DeviceSlot>>(std::move(device_slots));
    for (Child& c : children) {
      if (c.fd >= 0) ::close(c.fd);
    }
    children.clear();
    return;
  }
  Shutdown();
  device_slots.clear();
  ring = RingMemory();
}

// ---- The worker program -------------------------------------------------------------------

int RunWorkerProcess() {
  const int fd = kSocketFd;
  ::signal(SIGINT, SIG_IGN);
  ::signal(SIGPIPE, SIG_IGN);
  WireConfig cfg{};
  if (!RecvAll(fd, &cfg, sizeof(cfg))) return 2;
  auto refuse = [&](const Status& s) {
    SendResult(fd, s, StageTimes());
    return 2;
  };
  std::string build(cfg.build_bytes < 4096 ? cfg.build_bytes : 0, '\0');
  if (cfg.magic != kWireMagic || cfg.version != kWireVersion || cfg.batch_size == 0 ||
      cfg.transform_bytes != sizeof(TransformOptions) || cfg.build_bytes >= 4096 ||
      cfg.path_bytes >= 65536) {
    return refuse(Status::Unsupported("shardfeed-worker of another build (", BuildString(), ")"));
  }
  TransformOptions transform;
  std::string path(cfg.path_bytes, '\0');
  if (!RecvAll(fd, &transform, sizeof(transform)) || !RecvAll(fd, build.data(), build.size()) ||
      !RecvAll(fd, path.data(), path.size())) {
    return 2;
  }
  if (build != BuildString()) {
    return refuse(Status::Unsupported("shardfeed-worker is build '", BuildString(),
                                      "', the loader is build '", build, "'"));
  }
  auto archive = format::Archive::Open(path);
  if (!archive.ok()) return refuse(archive.status());
  if ((*archive)->size() != cfg.sample_count || ManifestHash(**archive) != cfg.manifest_hash) {
    return refuse(NotTheArchive(path));
  }
  void* map = ::mmap(nullptr, cfg.ring_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, kRingFd, 0);
  if (map == MAP_FAILED) return refuse(Status::IOError("mmap of the ring: ", strerror(errno)));
  ::close(kRingFd);
  uint8_t* ring = static_cast<uint8_t*>(map);
  if (!SendResult(fd, Status::OK(), StageTimes())) return 0;

  SampleDecoder decoder(*archive, transform);
  // The fields as the loader planned them, and the slot layout they give (which must be the
  // loader's: same build, same archive, same options).
  const FieldPlan plan =
      PlanFields((*archive)->schema(), cfg.fields, decoder.out_height(), decoder.out_width());
  auto layout = LayOutSlot(decoder.out_height(), decoder.out_width(), DTypeSize(transform.dtype),
                           cfg.batch_size, plan.region_bytes, !plan.empty());
  if (!layout.ok() || layout->slot_bytes != cfg.slot_bytes ||
      layout->sample_bytes != cfg.sample_bytes || cfg.slot_bytes == 0) {
    return refuse(
        Status::Internal("shardfeed-worker: the ring's slot layout differs from the "
                         "loader's"));
  }
  std::unique_ptr<FieldWriter> writer;
  if (!plan.empty()) {
    writer = std::make_unique<FieldWriter>(**archive, plan, *layout, transform.verify_checksums);
  }
  const pid_t parent = static_cast<pid_t>(cfg.parent_pid);
  WireTask task;
  while (WaitForParent(fd, parent) && RecvAll(fd, &task, sizeof(task))) {
    StageTimes times;
    Status s;
    const uint64_t slot_start = uint64_t(task.slot) * cfg.slot_bytes;
    if (task.offset > cfg.ring_bytes || cfg.ring_bytes - task.offset < cfg.sample_bytes ||
        task.slot < 0 || slot_start >= cfg.ring_bytes ||
        cfg.ring_bytes - slot_start < cfg.slot_bytes || task.position >= cfg.batch_size) {
      s = Status::Internal("task outside the ring");
    } else {
      try {
        SampleGeometry geometry;
        s = decoder.DecodeInto(task.index, task.seed, ring + task.offset, &times,
                               writer ? &geometry : nullptr);
        if (s.ok() && writer) {
          s = writer->Write(task.index, geometry, ring + slot_start, task.position);
        }
      } catch (...) {
        s = SampleException(path, task.index);
      }
    }
    if (!SendResult(fd, s, times)) break;
  }
  return 0;
}

}  // namespace shardfeed::reader
