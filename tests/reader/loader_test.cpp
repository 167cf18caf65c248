#include "shardfeed/reader/loader.h"

#include <dirent.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <set>
#include <thread>

#include "constant_archive.h"
#include "loader_util.h"
#include "raw_loader.h"
#include "shardfeed/converter/pack.h"
#include "test_util.h"

namespace shardfeed::reader {
namespace {

using format::Archive;
using testing::TempDir;

TEST_CASE("every sample of an epoch arrives exactly once, in whole batches") {
  TempDir dir;
  auto archive = MakeRawArchive(dir / "a", 103);
  for (bool shuffle : {false, true}) {
    for (int workers : {1, 2, 3}) {
      for (bool drop_last : {false, true}) {
        LoaderOptions o = CopyOptions(10, workers);
        o.shuffle = shuffle;
        o.drop_last = drop_last;
        auto loader = Loader::Create(archive, o);
        REQUIRE(loader.ok());
        Delivered d = ReadEpoch(**loader, 0);
        INFO("shuffle " << shuffle << " workers " << workers << " drop_last " << drop_last);
        if (drop_last) {
          CHECK(d.indices.size() == 100);
          CHECK(d.batch_sizes.size() == 10);
          CHECK(std::set<uint64_t>(d.indices.begin(), d.indices.end()).size() == 100);
        } else {
          REQUIRE(d.indices.size() == 103);
          CHECK(d.batch_sizes.back() == 3);
          std::vector<uint64_t> sorted = d.indices;
          std::sort(sorted.begin(), sorted.end());
          for (uint64_t i = 0; i < 103; ++i) REQUIRE(sorted[i] == i);
        }
        if (!shuffle && !drop_last) {
          for (uint64_t i = 0; i < 103; ++i) REQUIRE(d.indices[i] == i);
        }
        CHECK((*loader)->Stats().images == d.indices.size());
      }
    }
  }
}

TEST_CASE("the shuffled order is the same for any worker count and changes per epoch") {
  TempDir dir;
  auto archive = MakeRawArchive(dir / "a", 257);
  std::map<int, std::vector<uint64_t>> by_workers;
  for (int workers : {1, 2, 4}) {
    LoaderOptions o = CopyOptions(16, workers);
    o.shuffle = true;
    o.seed = 42;
    auto loader = Loader::Create(archive, o);
    REQUIRE(loader.ok());
    by_workers[workers] = ReadEpoch(**loader, 3).indices;
    if (workers == 1) {
      auto next_epoch = ReadEpoch(**loader, 4).indices;
      CHECK(next_epoch != by_workers[1]);
      CHECK(std::is_permutation(next_epoch.begin(), next_epoch.end(), by_workers[1].begin()));
    }
  }
  CHECK(by_workers[1] == by_workers[2]);
  CHECK(by_workers[1] == by_workers[4]);
  std::vector<uint64_t> identity(257);
  std::iota(identity.begin(), identity.end(), 0);
  CHECK(by_workers[1] != identity);
}

TEST_CASE("block shuffle visits every sample once and reads from few blocks at a time") {
  TempDir dir;
  auto archive = MakeRawArchive(dir / "a", 1000);
  std::vector<uint64_t> first;
  for (int workers : {1, 3}) {
    LoaderOptions o = CopyOptions(25, workers);
    o.shuffle = true;
    o.seed = 12;
    o.shuffle_block = 50;
    o.shuffle_window = 4;
    auto loader = Loader::Create(archive, o);
    REQUIRE(loader.ok());
    Delivered d = ReadEpoch(**loader, 0);
    REQUIRE(d.indices.size() == 1000);
    CHECK(std::set<uint64_t>(d.indices.begin(), d.indices.end()).size() == 1000);
    // Each window of 4 x 50 consecutive positions draws from at most 4 blocks of the archive.
    for (size_t start = 0; start < 1000; start += 200) {
      std::set<uint64_t> blocks;
      for (size_t k = start; k < start + 200; ++k) blocks.insert(d.indices[k] / 50);
      CHECK(blocks.size() <= 4);
    }
    if (workers == 1) {
      first = d.indices;
      auto next = ReadEpoch(**loader, 1).indices;
      CHECK(next != first);
    } else {
      CHECK(d.indices == first);  // the worker count does not matter
    }
  }
  std::vector<uint64_t> sorted = first;
  std::sort(sorted.begin(), sorted.end());
  CHECK(first != sorted);
}

TEST_CASE("ranks are disjoint, complete and have equal batch counts") {
  TempDir dir;
  auto archive = MakeRawArchive(dir / "a", 103);
  for (uint32_t world : {2u, 3u, 4u}) {
    for (bool drop_last : {false, true}) {
      std::vector<uint64_t> all;
      std::set<size_t> batch_counts;
      for (uint32_t rank = 0; rank < world; ++rank) {
        LoaderOptions o = CopyOptions(8, 2);
        o.shuffle = true;
        o.seed = 9;
        o.rank = rank;
        o.world_size = world;
        o.drop_last = drop_last;
        auto loader = Loader::Create(archive, o);
        REQUIRE(loader.ok());
        Delivered d = ReadEpoch(**loader, 1);
        batch_counts.insert(d.batch_sizes.size());
        CHECK(d.batch_sizes.size() == (*loader)->batches_per_epoch());
        all.insert(all.end(), d.indices.begin(), d.indices.end());
      }
      INFO("world " << world << " drop_last " << drop_last);
      CHECK(batch_counts.size() == 1);
      std::set<uint64_t> unique(all.begin(), all.end());
      if (drop_last) {
        CHECK(unique.size() == all.size());  // disjoint
        CHECK(all.size() >= 103 - world * 8 - world);
      } else {
        CHECK(unique.size() == 103);      // complete
        CHECK(all.size() - 103 < world);  // padding only to equalise ranks
      }
    }
  }
}

TEST_CASE("resuming mid-epoch gives exactly the batches of an uninterrupted run") {
  TempDir dir;
  auto archive = MakeRawArchive(dir / "a", 150);
  LoaderOptions o = CopyOptions(7, 2);
  o.shuffle = true;
  o.seed = 1234;
  auto full = Loader::Create(archive, o);
  REQUIRE(full.ok());
  Delivered whole = ReadEpoch(**full, 2);

  auto first = Loader::Create(archive, o);
  REQUIRE(first.ok());
  REQUIRE((*first)->StartEpoch(2).ok());
  for (int i = 0; i < 9; ++i) REQUIRE((*first)->Next().ok());
  LoaderState state = (*first)->State();
  CHECK(state.epoch == 2);
  CHECK(state.position == 9);
  first->reset();

  auto resumed = Loader::Create(archive, o);
  REQUIRE(resumed.ok());
  Delivered rest = ReadEpoch(**resumed, state.epoch, state.position);
  std::vector<uint64_t> tail(whole.indices.begin() + 9 * 7, whole.indices.end());
  CHECK(rest.indices == tail);
}

TEST_CASE("resuming with another batch size neither repeats nor skips a sample") {
  // Regression: the saved position (batches) was taken in the new loader's batch size, so a
  // resume from batch size 8 into 12 repeated or skipped samples.
  TempDir dir;
  auto archive = MakeRawArchive(dir / "a", 150);
  for (uint32_t resumed_batch : {12u, 5u, 8u}) {
    CAPTURE(resumed_batch);
    LoaderOptions o = CopyOptions(8, 2);
    o.shuffle = true;
    o.seed = 77;
    auto first = Loader::Create(archive, o);
    REQUIRE(first.ok());
    REQUIRE((*first)->StartEpoch(3).ok());
    std::vector<uint64_t> seen;
    for (int i = 0; i < 5; ++i) {
      auto b = (*first)->Next();
      REQUIRE(b.ok());
      seen.insert(seen.end(), b->indices(), b->indices() + b->size());
    }
    const LoaderState state = (*first)->State();
    CHECK(state.batch_size == 8);
    o.batch_size = resumed_batch;
    auto resumed = Loader::Create(archive, o);
    REQUIRE(resumed.ok());
    REQUIRE((*resumed)->Resume(state).ok());
    for (;;) {
      auto b = (*resumed)->Next();
      REQUIRE(b.ok());
      if (!*b) break;
      CHECK(b->epoch() == 3);
      seen.insert(seen.end(), b->indices(), b->indices() + b->size());
    }
    std::sort(seen.begin(), seen.end());
    REQUIRE(seen.size() == 150);
    for (uint64_t i = 0; i < 150; ++i) REQUIRE(seen[i] == i);
  }
}

// Threads of this process now.
size_t Threads() {
  size_t n = 0;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/task"))
    n += !e.path().empty();
  return n;
}

// Threads of this process once those that have ended are gone from /proc. A joined thread
// can still be listed for a moment: the kernel wakes pthread_join when the thread releases
// its memory, and removes its task entry a little later. Waits at most 10 s for `expected`
// and returns the count seen last.
size_t ThreadsSettled(size_t expected) {
  size_t n = Threads();
  for (int i = 0; i < 1000 && n != expected; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    n = Threads();
  }
  return n;
}

TEST_CASE("workers=auto delivers what a fixed count does; sleeping workers end cleanly") {
  testing::TempDir dir;
  auto archive = MakeRawArchive(dir / "a", 203);
  LoaderOptions fixed = CopyOptions(8, 3);
  fixed.shuffle = true;
  fixed.seed = 5;
  LoaderOptions tuned = fixed;
  tuned.workers = LoaderOptions::kAutoWorkers;
  tuned.max_workers = 3;
  auto a = Loader::Create(archive, fixed);
  auto b = Loader::Create(archive, tuned);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  for (uint64_t e = 0; e < 3; ++e) {
    CHECK(ReadEpoch(**a, e).indices == ReadEpoch(**b, e).indices);
    const EpochStats st = (*b)->Stats();
    CHECK(st.workers >= 1);
    CHECK(st.workers <= 3);
    CHECK(st.tuning.find("consumer waited") != std::string::npos);
  }
  b->reset();
  // Leave an epoch early with workers asleep, and destroy the loader: every thread ends. A
  // fresh loader has one worker claiming work and two asleep until its first tuning window
  // closes (Tuner::kWindow + 1 batches), so one batch in, two are asleep.
  size_t threads_before = Threads();  // the first loaders' threads may still be listed
  for (size_t seen = 0; seen != threads_before;) {
    seen = threads_before;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    threads_before = Threads();
  }
  auto c = Loader::Create(archive, tuned);
  REQUIRE(c.ok());
  CHECK(Threads() == threads_before + 3);
  REQUIRE((*c)->StartEpoch(7).ok());
  auto first = (*c)->Next();
  REQUIRE(first.ok());
  REQUIRE(*first);
  CHECK((*c)->Stats().workers == 1);
  c->reset();
  CHECK(ThreadsSettled(threads_before) == threads_before);
  CHECK(first->images()[0] == first->indices()[0] % 251);  // the lease outlives the loader
}

TEST_CASE(
    "run_ahead: the epoch expected next begins in free slots and is kept; others discard it") {
  TempDir dir;
  auto archive = MakeRawArchive(dir / "a", 50);  // 13 batches of 4
  for (WorkerMode mode : {WorkerMode::kThreads, WorkerMode::kProcesses}) {
    CAPTURE(int(mode));
    LoaderOptions on = CopyOptions(4, 2);
    on.shuffle = true;
    on.seed = 5;
    on.mode = mode;
    LoaderOptions off = on;
    off.run_ahead = false;
    auto a = Loader::Create(archive, on);
    auto b = Loader::Create(archive, off);
    REQUIRE(a.ok());
    REQUIRE(b.ok());
    // {epoch, start batch, whether the ring run ahead is kept}: the next epoch; the same epoch
    // again (then expected again); a jump; a resume mid-epoch; the next after that resume.
    struct Step {
      uint64_t epoch, start;
      bool kept;
    };
    const Step steps[] = {{0, 0, false}, {1, 0, true},  {1, 0, false}, {1, 0, true},
                          {7, 0, false}, {8, 3, false}, {9, 0, true}};
    bool first = true;
    for (const Step& step : steps) {
      CAPTURE(step.epoch, step.start);
      if (!first) testing::AwaitRunAhead(**a, 3);  // prefetch 3: the whole ring
      first = false;
      const Delivered got = ReadEpoch(**a, step.epoch, step.start);
      CHECK((*a)->Stats().ahead_kept == (step.kept ? 3u : 0u));
      const Delivered want = ReadEpoch(**b, step.epoch, step.start);
      CHECK(got.indices == want.indices);
      CHECK(got.batch_sizes == want.batch_sizes);
      CHECK((*b)->Stats().run_ahead_batches == 0);
    }
    // Leaving an epoch early never starts the next one; StartEpoch then cancels cleanly.
    REQUIRE((*a)->StartEpoch(10).ok());
    REQUIRE((*a)->Next().ok());
    CHECK((*a)->Stats().run_ahead_batches == 0);
    CHECK(ReadEpoch(**a, 11).indices == ReadEpoch(**b, 11).indices);
  }
}

// Under TSan: its mmap interceptor counts the zero pages mapped by the SIGBUS handler as a write
// racing with the other workers' reads of the same (lost) pages; tests/tsan.supp says why that
// is no race and suppresses it by the handler's frame only.
TEST_CASE("a shard truncated on disk while mapped is an error naming it, never a SIGBUS") {
  for (auto backend : {format::Backend::kLmdb, format::Backend::kHdf5}) {
    for (WorkerMode mode : {WorkerMode::kThreads, WorkerMode::kProcesses}) {
      CAPTURE(int(backend), int(mode));
      TempDir dir;
      auto archive = testing::MakeConstantArchive(dir / "a", 600, 32, backend);
      std::string shard;
      uint64_t biggest = 0;
      for (const auto& f : std::filesystem::directory_iterator(dir / "a")) {
        if (f.file_size() > biggest) biggest = f.file_size(), shard = f.path().string();
      }
      REQUIRE(biggest > 1 << 20);
      LoaderOptions o = CopyOptions(8, 2);
      o.mode = mode;
      auto loader = Loader::Create(archive, o);
      // skip_errors skips damaged samples, not an archive that changed under the reader (it
      // used to turn every later sample of the shard into a skipped one, and train on).
      LoaderOptions skipping = o;
      skipping.skip_errors = true;
      auto skipper = Loader::Create(archive, skipping);
      REQUIRE(loader.ok());
      REQUIRE(skipper.ok());
      for (auto* l : {&*loader, &*skipper}) {
        REQUIRE((*l)->StartEpoch(0).ok());
        REQUIRE((*l)->Next().ok());
      }
      // Another process cuts the file short under the mapping.
      REQUIRE(::truncate(shard.c_str(), 64 << 10) == 0);
      for (auto* l : {&*loader, &*skipper}) {
        Status error;
        for (;;) {
          auto b = (*l)->Next();
          if (!b.ok()) {
            error = b.status();
            break;
          }
          if (!*b) break;
        }
        REQUIRE_FALSE(error.ok());  // the epoch did not end as if nothing happened
        INFO(error.message());
        CHECK(error.code() == StatusCode::kChanged);
        CHECK(error.message().find("changed on disk while in use") != std::string::npos);
        CHECK(error.message().find(shard) != std::string::npos);
        CHECK(error.message().find("65536 bytes now") != std::string::npos);
      }
      // verify's path says the same, and the archive object stays usable for the message.
      CHECK(archive->VerifyRecord(599).code() == StatusCode::kChanged);
    }
  }
}

long ResidentKiB() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  }
  return 0;
}

TEST_CASE("memory does not grow over 20 epochs", "[no-tsan]") {
  TempDir dir;
  auto src = converter::ScanImageFolder(testing::SampleDir());
  REQUIRE(src.ok());
  converter::PackResult result;
  REQUIRE(converter::Pack(*src, dir / "a", {}, &result).ok());
  auto archive = Archive::Open(dir / "a");
  REQUIRE(archive.ok());
  LoaderOptions o;
  o.batch_size = 8;
  o.workers = 2;
  o.shuffle = true;
  o.transform.crop = Crop::kRandom;
  o.transform.size = 64;
  o.transform.flip = true;
  // A fixed ring: prefetch=auto would commit slots as the machine's speed asks, and what is
  // measured here is leaks, not the ring (one slot is 8 x 64 x 64 x 3 = 96 KiB).
  o.prefetch = 3;
  auto loader = Loader::Create(*archive, o);
  REQUIRE(loader.ok());
  long after_warmup = 0;
  for (uint64_t e = 0; e < 20; ++e) {
    REQUIRE((*loader)->StartEpoch(e).ok());
    while (true) {
      auto b = (*loader)->Next();
      REQUIRE(b.ok());
      if (!*b) break;
    }
    if (e == 2) after_warmup = ResidentKiB();
  }
  long growth = ResidentKiB() - after_warmup;
  INFO("RSS grew by " << growth << " KiB from epoch 2 to 20");
  CHECK(growth < 2048);
}

TEST_CASE("a sample that fails to decode is named in the consumer, or skipped on request") {
  TempDir dir;
  auto src = converter::ScanImageFolder(testing::SampleDir());
  REQUIRE(src.ok());
  converter::PackResult result;
  REQUIRE(converter::Pack(*src, dir / "a", {}, &result).ok());
  // Break sample 5's JPEG signature in the shard (its stored bytes start with FF D8 FF).
  uint64_t target = 5;
  std::vector<uint8_t> record;
  {
    auto a = Archive::Open(dir / "a");
    auto r = (*a)->At(target).ValueOrDie();
    record.assign(r.data, r.data + r.size);
  }
  std::string shard = dir / "a/shard-00000.mdb";
  auto bytes = testing::ReadBytes(shard);
  auto at = std::search(bytes.begin(), bytes.end(), record.begin(), record.end());
  REQUIRE(at != bytes.end());
  at[0] = 'X';
  at[1] = 'Y';
  testing::WriteBytes(shard, bytes);
  auto archive = Archive::Open(dir / "a");
  REQUIRE(archive.ok());

  for (WorkerMode mode : {WorkerMode::kThreads, WorkerMode::kProcesses}) {
    LoaderOptions o;
    o.batch_size = 4;
    o.workers = 2;
    o.mode = mode;
    o.transform.size = 32;
    auto loader = Loader::Create(*archive, o);
    REQUIRE(loader.ok());
    REQUIRE((*loader)->StartEpoch(0).ok());
    CHECK((*loader)->Next().ok());  // samples 0..3
    auto bad = (*loader)->Next();   // samples 4..7
    REQUIRE(!bad.ok());
    CHECK(bad.status().message().find("sample 5") != std::string::npos);
    CHECK(bad.status().message().find(dir / "a") != std::string::npos);
    CHECK((*loader)->Next().ok());  // the loader carries on

    o.skip_errors = true;
    auto skipping = Loader::Create(*archive, o);
    REQUIRE(skipping.ok());
    REQUIRE((*skipping)->StartEpoch(0).ok());
    REQUIRE((*skipping)->Next().ok());
    auto b = (*skipping)->Next();
    REQUIRE(b.ok());
    CHECK(b->labels()[1] == -1);
    CHECK(b->skipped() == 1);
  }
  // With checksum verification, damage anywhere in the payload is caught.
  LoaderOptions o;
  o.batch_size = 36;
  o.transform.size = 32;
  o.transform.verify_checksums = true;
  auto loader = Loader::Create(*archive, o);
  REQUIRE(loader.ok());
  auto b = (*loader)->Next();
  CHECK(b.status().code() == StatusCode::kChecksumMismatch);
}

TEST_CASE("a byte flipped in a record is an error naming it under default options") {
  // Regression: payload checksums were checked only on request, so a flipped pixel byte in a
  // raw record was delivered (and trained on) silently.
  TempDir dir;
  MakeRawArchive(dir / "a", 100);
  const std::string shard = dir / "a/shard-00000.mdb";
  auto bytes = testing::ReadBytes(shard);
  const std::vector<uint8_t> record(kSide * kSide * 3, 77);  // sample 77's pixels
  auto at = std::search(bytes.begin(), bytes.end(), record.begin(), record.end());
  REQUIRE(at != bytes.end());
  at[record.size() / 2] ^= 0x10;
  testing::WriteBytes(shard, bytes);
  auto archive = Archive::Open(dir / "a");
  REQUIRE(archive.ok());
  for (WorkerMode mode : {WorkerMode::kThreads, WorkerMode::kProcesses}) {
    CAPTURE(int(mode));
    LoaderOptions o;  // defaults, as a user has them
    o.batch_size = 10;
    o.mode = mode;
    o.transform.crop = Crop::kNone;
    o.transform.size = 0;
    auto loader = Loader::Create(*archive, o);
    REQUIRE(loader.ok());
    Status error;
    uint64_t delivered = 0;
    for (;;) {
      auto b = (*loader)->Next();
      if (!b.ok()) {
        error = b.status();
        continue;  // the loader goes on past a damaged batch
      }
      if (!*b) break;
      delivered += b->size();
    }
    CHECK(delivered == 90);  // every batch but the damaged one
    CHECK(error.code() == StatusCode::kChecksumMismatch);
    CHECK(error.message().find(dir / "a") != std::string::npos);
    CHECK(error.message().find("sample 77") != std::string::npos);
  }
}

TEST_CASE("worker processes give the same batches; a killed worker is an error, not a hang") {
  TempDir dir;
  auto archive = MakeRawArchive(dir / "a", 97);
  auto shm_entries = [] {
    std::set<std::string> names;
    if (DIR* d = opendir("/dev/shm")) {
      while (dirent* e = readdir(d)) names.insert(e->d_name);
      closedir(d);
    }
    return names;
  };
  auto shm_before = shm_entries();
  LoaderOptions o = CopyOptions(8, 2);
  o.shuffle = true;
  o.seed = 3;
  auto threads = Loader::Create(archive, o);
  o.mode = WorkerMode::kProcesses;
  auto procs = Loader::Create(archive, o);
  REQUIRE(threads.ok());
  REQUIRE(procs.ok());
  CHECK((*procs)->worker_pids().size() == 2);
  CHECK(ReadEpoch(**threads, 0).indices == ReadEpoch(**procs, 0).indices);
  CHECK(shm_entries() == shm_before);

  REQUIRE((*procs)->StartEpoch(1).ok());
  REQUIRE((*procs)->Next().ok());
  for (int pid : (*procs)->worker_pids()) ::kill(pid, SIGKILL);
  Status seen;
  for (int i = 0; i < 20 && seen.ok(); ++i) {
    auto b = (*procs)->Next();
    if (!b.ok())
      seen = b.status();
    else if (!*b)
      break;
  }
  CHECK(!seen.ok());
  CHECK(seen.message().find("worker process") != std::string::npos);
  CHECK(seen.message().find("signal 9") != std::string::npos);
  procs->reset();
  CHECK(shm_entries() == shm_before);
}

}  // namespace
}  // namespace shardfeed::reader
