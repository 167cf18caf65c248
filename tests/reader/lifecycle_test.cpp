// The loader's lifecycle contract (loader.h, docs/DESIGN.md "Lifecycle and failure"), in thread
// and process mode: early epoch exits, restarts, exceptions in workers, stuck, stopped and killed
// workers, destruction mid-epoch and fork. Each case checks the data delivered and that nothing
// is left behind (processes, descriptors). A hang fails through the loader's own timeout, and
// CTest's timeout guards the rest.
#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <iterator>
#include <numeric>
#include <set>
#include <sstream>
#include <thread>

#include "../../reader/src/failpoint.h"
#include "constant_archive.h"
#include "loader_util.h"
#include "shardfeed/reader/loader.h"
#include "test_util.h"

namespace shardfeed::reader {
namespace {

using format::Archive;
using testing::TempDir;

constexpr uint32_t kSide = 24;

std::shared_ptr<Archive> MakeArchive(const std::string& path, uint64_t n) {
  return testing::MakeConstantArchive(path, n, kSide);
}

// The state letter of process `pid` in /proc/PID/stat (R, S, T for stopped, Z...), or 0.
char ProcessState(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t paren = text.rfind(')');
  return paren == std::string::npos || paren + 2 >= text.size() ? 0 : text[paren + 2];
}

LoaderOptions Options(WorkerMode mode) {
  LoaderOptions o;
  o.batch_size = 32;
  o.workers = 2;
  o.prefetch = 3;
  o.shuffle = true;
  o.seed = 11;
  o.mode = mode;
  o.transform.crop = Crop::kRandom;
  o.transform.size = 64;  // some work per sample, so batches are caught half-filled
  o.timeout = 20;         // a leaked slot fails with kTimeout instead of hanging the suite
  return o;
}

std::set<pid_t> Children() {
  std::set<pid_t> out;
  const pid_t self = ::getpid();
  if (DIR* d = ::opendir("/proc")) {
    while (dirent* e = ::readdir(d)) {
      pid_t pid = std::atoi(e->d_name);
      if (pid <= 0) continue;
      std::ifstream stat(std::string("/proc/") + e->d_name + "/stat");
      std::string line;
      std::getline(stat, line);
      size_t close = line.rfind(')');
      if (close == std::string::npos) continue;
      std::istringstream rest(line.substr(close + 2));
      char state;
      pid_t ppid = 0;
      rest >> state >> ppid;
      if (ppid == self) out.insert(pid);
    }
    ::closedir(d);
  }
  return out;
}

size_t OpenFds() {
  size_t n = 0;
  if (DIR* d = ::opendir("/proc/self/fd")) {
    while (::readdir(d)) ++n;
    ::closedir(d);
  }
  return n;
}

// Reads the rest of the epoch, checking every sample's pixels and label; returns the indices.
std::vector<uint64_t> Drain(Loader& loader) {
  std::vector<uint64_t> seen;
  for (;;) {
    auto b = loader.Next();
    REQUIRE(b.ok());
    if (!*b) break;
    const size_t per = b->image_bytes() / b->size();
    for (uint32_t j = 0; j < b->size(); ++j) {
      const uint64_t idx = b->indices()[j];
      seen.push_back(idx);
      REQUIRE(b->labels()[j] == static_cast<int64_t>(idx % 5));
      const uint8_t* img = b->images() + j * per;
      REQUIRE(img[0] == idx % 251);
      REQUIRE(img[per - 1] == idx % 251);
    }
  }
  return seen;
}

void RequireExactlyOnce(std::vector<uint64_t> seen, uint64_t n) {
  REQUIRE(seen.size() == n);
  std::sort(seen.begin(), seen.end());
  for (uint64_t i = 0; i < n; ++i) REQUIRE(seen[i] == i);
}

const char* ModeName(WorkerMode m) { return m == WorkerMode::kThreads ? "threads" : "processes"; }

TEST_CASE("leaving epochs early after k batches, repeatedly, never leaks a ring slot") {
  TempDir dir;
  auto archive = MakeArchive(dir / "a", 700);
  for (WorkerMode mode : {WorkerMode::kThreads, WorkerMode::kProcesses}) {
    INFO("mode " << ModeName(mode));
    const size_t fds = OpenFds();
    {
      LoaderOptions o = Options(mode);
      auto loader = Loader::Create(archive, o);
      REQUIRE(loader.ok());
      uint64_t epoch = 0;
      for (int repeat = 0; repeat < 3; ++repeat) {
        for (uint32_t k = 0; k <= o.prefetch + 1; ++k) {
          INFO("break after " << k << " batches, repeat " << repeat);
          REQUIRE((*loader)->StartEpoch(epoch++).ok());
          for (uint32_t i = 0; i < k; ++i) {
            auto b = (*loader)->Next();
            REQUIRE(b.ok());
            REQUIRE(*b);
          }
        }
      }
      REQUIRE((*loader)->StartEpoch(epoch).ok());
      RequireExactlyOnce(Drain(**loader), 700);
    }
    CHECK(Children().empty());
    CHECK(OpenFds() == fds);
  }
}

TEST_CASE("a new epoch while a worker holds a sample mid-batch: its slot comes back after") {
  // Batch 1's slot has a sample in a worker's hands when the epoch is abandoned: the decode of
  // batch 1's ninth sample is held at a gate (a failpoint) until the new epoch has begun, so
  // the order of events does not depend on when a signal lands. With a ring of 2, the new
  // epoch is read whole only if that slot comes back.
  for (WorkerMode mode : {WorkerMode::kThreads, WorkerMode::kProcesses}) {
    INFO("mode " << ModeName(mode));
    TempDir dir;
    auto archive = MakeArchive(dir / "a", 200);
    LoaderOptions o = Options(mode);
    o.workers = 1;
    o.prefetch = 2;
    SamplerOptions so;
    so.shuffle = o.shuffle;
    so.seed = o.seed;
    so.batch_size = o.batch_size;
    Sampler sampler(200, so);
    const uint64_t held = sampler.At(sampler.Plan(0), o.batch_size + 8);
    testing::DecodeGate gate(dir / "", held);
    auto loader = Loader::Create(archive, o);
    REQUIRE(loader.ok());
    REQUIRE((*loader)->StartEpoch(0).ok());
    {
      auto b = (*loader)->Next();
      REQUIRE(b.ok());
      CHECK(b->number() == 0);
    }
    gate.AwaitHeld();
    REQUIRE((*loader)->StartEpoch(1).ok());
    gate.Release();
    RequireExactlyOnce(Drain(**loader), 200);
  }
}

TEST_CASE("a new epoch while the last run of a batch completes cannot free its slot") {
  // Regression for FinishRun's race (0ae13a7): it used to drop the last run's in_flight in its
  // first locked section and mark the slot ready in the second without looking, so a StartEpoch
  // between them freed the slot, another worker began a new batch in it, and the stale mark
  // declared that half-filled batch ready. A failpoint holds the run that completes batch 2
  // between the two sections while the epoch is abandoned and the other worker is held filling
  // epoch 1's batch 0 (in the slot the race would hand it); batch 0 must then not be ready
  // before its held sample is decoded, and must hold epoch 1's first indices.
  TempDir dir;
  auto archive = MakeArchive(dir / "a", 96);
  LoaderOptions o = Options(WorkerMode::kThreads);
  o.batch_size = 32;
  o.workers = 2;
  o.prefetch = 2;
  o.run_ahead = false;
  SamplerOptions so;
  so.shuffle = o.shuffle;
  so.seed = o.seed;
  so.batch_size = o.batch_size;
  Sampler sampler(96, so);
  const EpochPlan p0 = sampler.Plan(0), p1 = sampler.Plan(1);
  // Epoch 0 is read from batch 1: a sample of epoch 1's batch 0 that epoch 0 never decodes.
  uint64_t pos = 32;
  for (uint64_t k = 0; k < 32 && pos == 32; ++k) {
    bool in_epoch0 = false;
    for (uint64_t j = 32; j < 96; ++j) in_epoch0 |= sampler.At(p0, j) == sampler.At(p1, k);
    if (!in_epoch0) pos = k;
  }
  REQUIRE(pos < 32);
  testing::FifoGate finish(dir / "finish"), decode(dir / "decode");
  testing::FailpointScope failpoints(
      "finish_gate=2,decode_gate=" + std::to_string(sampler.At(p1, pos)),
      {{"SHARDFEED_FAILPOINT_FINISH_GATE", finish.path()},
       {"SHARDFEED_FAILPOINT_GATE", decode.path()}});
  auto loader = Loader::Create(archive, o);
  REQUIRE(loader.ok());
  REQUIRE((*loader)->StartEpoch(0, 1).ok());
  {
    auto b = (*loader)->Next();  // batch 1; its slot goes back to the ring when dropped
    REQUIRE(b.ok());
    REQUIRE(b->number() == 1);
  }
  finish.AwaitHeld();  // the run completing batch 2 is between FinishRun's locked sections
  REQUIRE((*loader)->StartEpoch(1).ok());
  decode.AwaitHeld();  // the other worker fills epoch 1's batch 0 and is held at `pos`
  finish.Release();
  // The held FinishRun has ended once a batch is ready (bounded poll).
  for (int i = 0; i < 60000 && (*loader)->Stats().ready_batches == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  bool waited = false;
  auto b = (*loader)->Next([&] {
    waited = true;
    decode.Release();
    return Status::OK();
  });
  REQUIRE(b.ok());
  CHECK(b->number() == 0);
  CHECK(waited);  // batch 0 cannot be ready while one of its samples is held
  for (uint32_t j = 0; j < b->size(); ++j) CHECK(b->indices()[j] == sampler.At(p1, j));
  decode.Release();
}

TEST_CASE("a new epoch or a resume mid-epoch delivers exactly the rest") {
  TempDir dir;
  auto archive = MakeArchive(dir / "a", 301);
  for (WorkerMode mode : {WorkerMode::kThreads, WorkerMode::kProcesses}) {
    INFO("mode " << ModeName(mode));
    auto loader = Loader::Create(archive, Options(mode));
    REQUIRE(loader.ok());
    REQUIRE((*loader)->StartEpoch(4).ok());
    std::vector<uint64_t> first;
    for (int i = 0; i < 3; ++i) {
      auto b = (*loader)->Next();
      REQUIRE(b.ok());
      first.insert(first.end(), b->indices(), b->indices() + b->size());
    }
    LoaderState state = (*loader)->State();
    CHECK(state.position == 3);
    // Abandon it for another epoch, read that one whole.
    REQUIRE((*loader)->StartEpoch(5).ok());
    RequireExactlyOnce(Drain(**loader), 301);
    // Resume epoch 4 where it stood, on a fresh loader.
    auto resumed = Loader::Create(archive, Options(mode));
    REQUIRE(resumed.ok());
    REQUIRE((*resumed)->StartEpoch(state.epoch, state.position).ok());
    std::vector<uint64_t> rest = Drain(**resumed);
    rest.insert(rest.end(), first.begin(), first.end());
    RequireExactlyOnce(rest, 301);
  }
}

// Threads of this process now (/proc/self/task).
size_t ThreadCount() {
  size_t n = 0;
  if (DIR* d = ::opendir("/proc/self/task")) {
    while (dirent* e = ::readdir(d)) n += e->d_name[0] != '.';
    ::closedir(d);
  }
  return n;
}

TEST_CASE("a worker thread the system cannot start is Create's error, and the others end") {
  // REGRESSION: std::thread's std::system_error escaped Loader::Create, and the threads already
  // started (each keeping the loader's state alive) waited for work forever.
  TempDir dir;
  auto archive = MakeArchive(dir / "a", 100);
  ::setenv("SHARDFEED_FAILPOINTS", "thread_start_fail=2", 1);
  Failpoints::Get().Reload();
  std::thread([] {}).join();  // a sanitizer's own helper thread starts with the first thread
  const size_t before = ThreadCount();
  LoaderOptions o = Options(WorkerMode::kThreads);
  o.workers = 4;
  Result<std::unique_ptr<Loader>> loader = Status::OK();
  REQUIRE_NOTHROW(loader = Loader::Create(archive, o));
  ::unsetenv("SHARDFEED_FAILPOINTS");
  Failpoints::Get().Reload();
  REQUIRE_FALSE(loader.ok());
  CHECK(loader.status().message().find("cannot start loader worker thread 2 of 4") !=
        std::string::npos);
  CHECK(ThreadCount() == before);           // joined before Create returned
  auto again = Loader::Create(archive, o);  // nothing left behind that stops the next one
  REQUIRE(again.ok());
  REQUIRE((*again)->StartEpoch(0).ok());
  CHECK(Drain(**again).size() == 100);
}

TEST_CASE("a batch that failed with an error that may pass is read again, not consumed") {
  // Before, a batch whose read failed with kIOError (a remote download, the server down) was
  // consumed like a data error: an epoch continued after it lacked the batch's samples.
  TempDir dir;
  auto archive = MakeArchive(dir / "a", 100);
  ::setenv("SHARDFEED_FAILPOINTS", "io_error_once=40", 1);
  Failpoints::Get().Reload();
  for (WorkerMode mode : {WorkerMode::kThreads, WorkerMode::kProcesses}) {
    for (bool skip : {false, true}) {
      INFO("mode " << ModeName(mode) << " skip_errors " << skip);
      Failpoints::Get().Reload();  // once per process: again for this loader's threads
      LoaderOptions o = Options(mode);
      o.shuffle = false;  // sample 40 is in batch 1, of 32
      o.skip_errors = skip;
      auto loader = Loader::Create(archive, o);
      REQUIRE(loader.ok());
      REQUIRE((*loader)->StartEpoch(0).ok());
      int errors = 0;
      uint64_t skipped = 0;
      std::vector<uint64_t> seen;
      for (;;) {
        auto b = (*loader)->Next();
        if (!b.ok()) {
          ++errors;
          CHECK(b.status().code() == StatusCode::kIOError);
          CHECK(b.status().message().find("failpoint io_error_once") != std::string::npos);
          CHECK((*loader)->State().position == 1);  // batch 1 is still the next one
          REQUIRE(errors <= 4);                     // once per worker process at most
          continue;
        }
        if (!*b) break;
        skipped += b->skipped();
        for (uint32_t j = 0; j < b->size(); ++j) seen.push_back(b->indices()[j]);
      }
      std::vector<uint64_t> all(100);
      std::iota(all.begin(), all.end(), 0);
      CHECK(seen == all);  // every sample once, in order
      CHECK((*loader)->Stats().images == 100);
      // skip_errors skips the sample (a zero image labelled -1), as any it cannot read.
      CHECK(errors == (skip ? 0 : errors > 0 ? errors : 1));
      CHECK(skipped == (skip ? 1u : 0u));
    }
  }
  ::unsetenv("SHARDFEED_FAILPOINTS");
  Failpoints::Get().Reload();
}

TEST_CASE("an exception in a decoder is its sample's error, never the process's end") {
  TempDir dir;
  auto archive = MakeArchive(dir / "a", 100);
  ::setenv("SHARDFEED_FAILPOINTS", "decode_throw=7", 1);
  Failpoints::Get().Reload();
  for (WorkerMode mode : {WorkerMode::kThreads, WorkerMode::kProcesses}) {
    for (bool skip : {false, true}) {
      INFO("mode " << ModeName(mode) << " skip_errors " << skip);
      LoaderOptions o = Options(mode);
      o.shuffle = false;  // sample 7 is in batch 0, of 32
      o.skip_errors = skip;
      auto loader = Loader::Create(archive, o);
      REQUIRE(loader.ok());
      REQUIRE((*loader)->StartEpoch(0).ok());
      int errors = 0;
      uint64_t delivered = 0, skipped = 0;
      for (;;) {
        auto b = (*loader)->Next();
        if (!b.ok()) {
          ++errors;
          CHECK(b.status().message().find("sample 7") != std::string::npos);
          CHECK(b.status().message().find("failpoint decode_throw") != std::string::npos);
          continue;  // the loader goes on with the next batch
        }
        if (!*b) break;
        delivered += b->size();
        skipped += b->skipped();
        const size_t per = b->image_bytes() / b->size();
        for (uint32_t j = 0; j < b->size(); ++j) {
          if (b->indices()[j] != 7) continue;
          CHECK(b->labels()[j] == -1);
          CHECK(std::all_of(b->images() + j * per, b->images() + (j + 1) * per,
                            [](uint8_t v) { return v == 0; }));
        }
      }
      if (skip) {
        CHECK(errors == 0);
        CHECK(skipped == 1);
        CHECK(delivered == 100);
      } else {
        CHECK(errors == 1);
        CHECK(delivered == 100 - 32);  // the failed batch is not delivered
      }
    }
  }
  ::unsetenv("SHARDFEED_FAILPOINTS");
  Failpoints::Get().Reload();
}

TEST_CASE("a worker stuck on a sample run ahead times out in the epoch that keeps it") {
  // Epoch 0 resumed at batch 5 never decodes sample 0; the run-ahead of epoch 1 does, and
  // hangs there. StartEpoch(1) keeps that batch, so its Next() times out naming sample 0, the
  // stuck process is killed and reaped, and nothing is left behind.
  TempDir dir;
  auto archive = MakeArchive(dir / "a", 40);
  ::setenv("SHARDFEED_FAILPOINTS", "decode_hang=0", 1);
  LoaderOptions o = Options(WorkerMode::kProcesses);
  o.batch_size = 4;
  o.shuffle = false;
  o.timeout = 1;
  const size_t fds = OpenFds();
  {
    auto loader = Loader::Create(archive, o);
    ::unsetenv("SHARDFEED_FAILPOINTS");
    REQUIRE(loader.ok());
    Loader& l = **loader;
    REQUIRE(l.StartEpoch(0, 5).ok());
    for (;;) {
      auto b = l.Next();
      REQUIRE(b.ok());
      if (!*b) break;
    }
    testing::AwaitRunAhead(l, 3);
    REQUIRE(l.StartEpoch(1).ok());
    CHECK(l.Stats().ahead_kept == 3);
    auto b = l.Next();
    REQUIRE(b.status().code() == StatusCode::kTimeout);
    CHECK(b.status().message().find("has held sample 0 all that time") != std::string::npos);
    CHECK(b.status().message().find("killed") != std::string::npos);
  }
  CHECK(Children().empty());
  CHECK(OpenFds() == fds);
}

TEST_CASE("a stuck or stopped worker process times out naming it, and is killed and reaped") {
  TempDir dir;
  auto archive = MakeArchive(dir / "a", 200);
  for (bool stopped : {false, true}) {
    INFO((stopped ? "SIGSTOP" : "hung decode"));
    if (!stopped) ::setenv("SHARDFEED_FAILPOINTS", "decode_hang=50", 1);
    LoaderOptions o = Options(WorkerMode::kProcesses);
    o.shuffle = false;
    o.timeout = 1;
    const size_t fds = OpenFds();
    {
      auto loader = Loader::Create(archive, o);
      ::unsetenv("SHARDFEED_FAILPOINTS");
      REQUIRE(loader.ok());
      REQUIRE((*loader)->StartEpoch(0).ok());
      if (stopped) {
        REQUIRE((*loader)->Next().ok());
        for (int pid : (*loader)->worker_pids()) ::kill(pid, SIGSTOP);
        // Until each has stopped (polled, bounded): from then on no batch is made, so the 3 the
        // ring holds at most come before the timeout (6 remain), whenever the signal landed.
        for (int pid : (*loader)->worker_pids()) {
          int i = 0;
          for (; i < 60000 && ProcessState(pid) != 'T'; ++i) {
            std::this_thread::sleep_for(std::chrono::milliseconds(1));  // a polling interval
          }
          REQUIRE(i < 60000);
        }
      }
      Status seen;
      for (int i = 0; i < 10 && seen.ok(); ++i) {
        auto b = (*loader)->Next();
        if (!b.ok()) seen = b.status();
      }
      REQUIRE(seen.code() == StatusCode::kTimeout);
      CHECK(seen.message().find("worker") != std::string::npos);
      CHECK(seen.message().find("process") != std::string::npos);
      if (!stopped) CHECK(seen.message().find("sample 50") != std::string::npos);
      // The loader says it cannot go on, every time.
      CHECK((*loader)->Next().status().code() == StatusCode::kTimeout);
      CHECK(!(*loader)->StartEpoch(1).ok());
    }
    CHECK(Children().empty());
    CHECK(OpenFds() == fds);
  }
}

TEST_CASE("a killed worker process fails the loader with its name; nothing is left behind") {
  // The worker killed is the one holding a sample (sample 40's decode is held at the
  // decode_gate failpoint; the process with the gate open is the one), so the death is seen
  // whatever the timing. Regression: killing worker 0 while it was idle let the other finish
  // the epoch first, and the loop ended without an error now and then.
  TempDir dir;
  auto archive = MakeArchive(dir / "a", 300);
  const std::string gate_path = dir / "gate";
  testing::DecodeGate gate(dir / "", 40);
  const size_t fds = OpenFds();
  {
    LoaderOptions o = Options(WorkerMode::kProcesses);
    o.shuffle = false;
    auto loader = Loader::Create(archive, o);
    REQUIRE(loader.ok());
    REQUIRE((*loader)->StartEpoch(0).ok());
    REQUIRE((*loader)->Next().ok());
    gate.AwaitHeld();
    // Its open() returns once the gate has a writer: poll (bounded) for the descriptor.
    pid_t holder = -1;
    for (int i = 0; i < 60000 && holder < 0; ++i) {
      for (int pid : (*loader)->worker_pids()) {
        const std::string fd_dir = "/proc/" + std::to_string(pid) + "/fd";
        for (const auto& e : std::filesystem::directory_iterator(fd_dir)) {
          std::error_code ec;
          if (std::filesystem::read_symlink(e.path(), ec).string() == gate_path) holder = pid;
        }
      }
      if (holder < 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    REQUIRE(holder > 0);
    ::kill(holder, SIGKILL);
    gate.Release();
    Status seen;
    for (int i = 0; i < 20 && seen.ok(); ++i) {
      auto b = (*loader)->Next();
      if (!b.ok()) seen = b.status();
      if (b.ok() && !*b) break;
    }
    REQUIRE(!seen.ok());
    CHECK(seen.message().find("signal 9") != std::string::npos);
    CHECK(!(*loader)->Next().ok());
  }
  CHECK(Children().empty());
  CHECK(OpenFds() == fds);
}

TEST_CASE("destroying a loader mid-epoch is prompt; a batch still held stays valid") {
  TempDir dir;
  auto archive = MakeArchive(dir / "a", 500);
  for (WorkerMode mode : {WorkerMode::kThreads, WorkerMode::kProcesses}) {
    INFO("mode " << ModeName(mode));
    const size_t fds = OpenFds();
    Batch held;
    {
      auto loader = Loader::Create(archive, Options(mode));
      REQUIRE(loader.ok());
      REQUIRE((*loader)->StartEpoch(0).ok());
      auto b = (*loader)->Next();
      REQUIRE(b.ok());
      held = *b;
    }
    CHECK(Children().empty());
    const size_t per = held.image_bytes() / held.size();
    for (uint32_t j = 0; j < held.size(); ++j) {
      CHECK(held.images()[j * per] == held.indices()[j] % 251);
      CHECK(held.labels()[j] == static_cast<int64_t>(held.indices()[j] % 5));
    }
    held.Release();
    CHECK(OpenFds() == fds);
  }
}

// Runs `body` in a forked child (with an alarm against hangs) and returns its exit status.
template <typename F>
int InChild(F body) {
  pid_t pid = ::fork();
  if (pid == 0) {
    ::alarm(60);
    int code = body();
    std::_Exit(code);  // skip Catch2's and the parent's atexit state
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return status;
}

TEST_CASE("fork after a loader exists: the child's copy is inert, the child reads on its own",
          "[fork][no-tsan]") {
  TempDir dir;
  auto archive = MakeArchive(dir / "a", 150);
  for (WorkerMode mode : {WorkerMode::kThreads, WorkerMode::kProcesses}) {
    INFO("mode " << ModeName(mode));
    auto loader = Loader::Create(archive, Options(mode));
    REQUIRE(loader.ok());
    REQUIRE((*loader)->StartEpoch(0).ok());
    REQUIRE((*loader)->Next().ok());
    int status = InChild([&] {
      auto copy = (*loader)->Next();
      if (copy.ok()) return 10;
      if (copy.status().message().find("forked copy") == std::string::npos) return 11;
      auto own = Loader::Create(archive, Options(mode));
      if (!own.ok()) return 12;
      if (!(*own)->StartEpoch(0).ok()) return 13;
      uint64_t n = 0;
      for (;;) {
        auto b = (*own)->Next();
        if (!b.ok()) return 14;
        if (!*b) break;
        for (uint32_t j = 0; j < b->size(); ++j) {
          if (b->images()[j * (b->image_bytes() / b->size())] != b->indices()[j] % 251) return 15;
        }
        n += b->size();
      }
      if (n != 150) return 16;
      own->reset();
      loader->reset();  // the inherited copy: must neither join nor wait
      return 0;
    });
    REQUIRE(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
    // The parent's loader is untouched.
    std::vector<uint64_t> rest = Drain(**loader);
    CHECK(rest.size() == 150 - 32);
  }
}

TEST_CASE("options that cannot make a ring are refused at Create") {
  TempDir dir;
  auto archive = MakeArchive(dir / "a", 10);
  LoaderOptions o = Options(WorkerMode::kThreads);
  o.transform.size = 2147483648u;
  auto r = Loader::Create(archive, o);
  REQUIRE(!r.ok());
  CHECK(r.status().code() == StatusCode::kInvalidArgument);
  o.transform.size = 64;
  o.timeout = -1;
  CHECK(!Loader::Create(archive, o).ok());
}

}  // namespace
}  // namespace shardfeed::reader

namespace shardfeed::reader {
namespace {

TEST_CASE("a worker process that does not start is a timeout, not a hang") {
  // A stand-in worker program that never answers (as one stuck opening an archive on a hung
  // network filesystem would): Create must give up after `timeout` and leave nothing behind.
  testing::TempDir dir;
  auto archive = testing::MakeConstantArchive(dir / "a", 20, 4);
  const std::string program = dir / "stuck-worker";
  {
    std::ofstream script(program);
    script << "#!/bin/sh\nexec sleep 600\n";
  }
  REQUIRE(::chmod(program.c_str(), 0755) == 0);
  ::setenv("SHARDFEED_WORKER", program.c_str(), 1);
  LoaderOptions o = Options(WorkerMode::kProcesses);
  o.timeout = 1;
  auto loader = Loader::Create(archive, o);
  ::unsetenv("SHARDFEED_WORKER");
  REQUIRE(!loader.ok());
  CHECK(loader.status().code() == StatusCode::kTimeout);
  CHECK(loader.status().message().find("did not start") != std::string::npos);
  CHECK(Children().empty());
}

TEST_CASE("worker processes refuse an archive other than the one the loader opened") {
  // Workers reopen the archive by its path. Regression: a relative path after a chdir, or an
  // archive replaced on disk after it was opened, made them read another archive of the same
  // size (and shape) than the parent's, silently.
  TempDir dir;
  testing::MakeConstantArchive(dir / "sub/a", 40, kSide, format::Backend::kLmdb, 1);
  LoaderOptions o = Options(WorkerMode::kProcesses);
  SECTION("a relative path, then chdir") {
    testing::MakeConstantArchive(dir / "a", 40, kSide);
    const auto cwd = std::filesystem::current_path();
    std::filesystem::current_path(std::string(dir / ""));
    auto archive = Archive::Open("a");
    std::filesystem::current_path(std::string(dir / "sub"));
    REQUIRE(archive.ok());
    auto loader = Loader::Create(*archive, o);
    std::filesystem::current_path(cwd);
    REQUIRE_FALSE(loader.ok());
    CHECK(loader.status().message().find("another archive") != std::string::npos);
    CHECK(loader.status().message().find("relative path") != std::string::npos);
  }
  SECTION("the archive replaced on disk after it was opened") {
    auto archive = MakeArchive(dir / "a", 40);
    std::filesystem::rename(std::string(dir / "a"), std::string(dir / "old"));
    std::filesystem::rename(std::string(dir / "sub/a"), std::string(dir / "a"));
    auto loader = Loader::Create(archive, o);
    REQUIRE_FALSE(loader.ok());
    CHECK(loader.status().message().find(dir / "a") != std::string::npos);
    CHECK(loader.status().message().find("replaced on disk") != std::string::npos);
  }
  CHECK(Children().empty());
}

TEST_CASE("destroying a loader whose decode thread is stuck is bounded; the thread ends later") {
  // Regression: thread mode joined a worker stuck in a decode (a slow read, a huge image)
  // without bound. The decode of sample 3 is held at a gate until the loader is gone.
  TempDir dir;
  auto archive = MakeArchive(dir / "a", 64);
  testing::DecodeGate gate(dir / "", 3);
  LoaderOptions o = Options(WorkerMode::kThreads);
  o.shuffle = false;
  auto loader = Loader::Create(archive, o);
  REQUIRE(loader.ok());
  REQUIRE((*loader)->StartEpoch(0).ok());
  gate.AwaitHeld();
  auto destroyed = std::async(std::launch::async, [&] { loader->reset(); });
  // Bounded by kShutdownGrace; 60 s here only so that a regression fails instead of hanging.
  const bool prompt = destroyed.wait_for(std::chrono::seconds(60)) == std::future_status::ready;
  gate.Release();
  destroyed.wait();
  REQUIRE(prompt);
  // The stuck thread kept the archive (and the ring it writes into) alive; once its sample is
  // done it ends and lets them go.
  for (int i = 0; i < 60000 && archive.use_count() > 1; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  CHECK(archive.use_count() == 1);
}

}  // namespace
}  // namespace shardfeed::reader
