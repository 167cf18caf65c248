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
#include "shardfeed/converter/pack.h"
#include "test_util.h"

namespace shardfeed::reader {
namespace {

using format::Archive;
using testing::TempDir;

constexpr uint32_t kSide = 6;

std::shared_ptr<Archive> MakeRawArchive(const std::string& path, uint64_t n) {
  return testing::MakeConstantArchive(path, n, kSide);
}

LoaderOptions CopyOptions(uint32_t batch, int workers) {
  LoaderOptions o;
  o.batch_size = batch;
  o.workers = workers;
  o.prefetch = 3;
  o.transform.crop = Crop::kNone;
  o.transform.size = 0;
  return o;
}

struct Delivered {
  std::vector<uint64_t> indices;
  std::vector<uint32_t> batch_sizes;
};

// Reads one epoch, checking each sample's pixels and label against its index.
Delivered ReadEpoch(Loader& loader, uint64_t epoch, uint64_t start = 0) {
  Delivered d;
  REQUIRE(loader.StartEpoch(epoch, start).ok());
  for (;;) {
    auto b = loader.Next();
    REQUIRE(b.ok());
    if (!*b) break;
    d.batch_sizes.push_back(b->size());
    const size_t per = b->image_bytes() / b->size();
    for (uint32_t j = 0; j < b->size(); ++j) {
      uint64_t idx = b->indices()[j];
      d.indices.push_back(idx);
      REQUIRE(b->labels()[j] == static_cast<int64_t>(idx % 5));
      const uint8_t* img = b->images() + j * per;
      REQUIRE(img[0] == idx % 251);
      REQUIRE(img[per - 1] == idx % 251);
    }
  }
  return d;
}

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

// Threads of this process now.
size_t Threads() {
  size_t n = 0;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/task"))
    n += !e.path().empty();
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
  const size_t threads_before = Threads();
  auto c = Loader::Create(archive, tuned);
  REQUIRE(c.ok());
  CHECK(Threads() == threads_before + 3);
  REQUIRE((*c)->StartEpoch(7).ok());
  auto first = (*c)->Next();
  REQUIRE(first.ok());
  REQUIRE(*first);
  CHECK((*c)->Stats().workers == 1);
  c->reset();
  CHECK(Threads() == threads_before);
  CHECK(first->images()[0] == first->indices()[0] % 251);  // the lease outlives the loader
}

TEST_CASE("a held batch keeps its memory; holding every slot is an error, not a hang") {
  TempDir dir;
  auto archive = MakeRawArchive(dir / "a", 60);
  LoaderOptions o = CopyOptions(4, 2);
  o.prefetch = 2;
  auto loader = Loader::Create(archive, o);
  REQUIRE(loader.ok());
  REQUIRE((*loader)->StartEpoch(0).ok());
  auto held = (*loader)->Next();
  REQUIRE(held.ok());
  std::vector<uint8_t> copy(held->images(), held->images() + held->image_bytes());
  for (int i = 0; i < 10; ++i) {
    auto b = (*loader)->Next();
    REQUIRE(b.ok());
    REQUIRE(b->images() != held->images());
  }
  CHECK(std::equal(copy.begin(), copy.end(), held->images()));
  auto second = (*loader)->Next();
  REQUIRE(second.ok());
  auto starved = (*loader)->Next();
  CHECK(starved.status().code() == StatusCode::kResourceExhausted);
  second->Release();
  CHECK((*loader)->Next().ok());
}

TEST_CASE("prefetch=auto: two slots at first, a slot more while the consumer holds them all") {
  TempDir dir;
  auto archive = MakeRawArchive(dir / "a", 200);
  LoaderOptions o = CopyOptions(4, 2);
  o.prefetch = LoaderOptions::kAutoPrefetch;
  o.max_prefetch = 5;
  auto loader = Loader::Create(archive, o);
  REQUIRE(loader.ok());
  Loader& l = **loader;
  REQUIRE(l.StartEpoch(0).ok());
  EpochStats st = l.Stats();
  CHECK(st.prefetch == 2);
  const uint64_t slot = st.ring_bytes / 2;
  CHECK(slot >= uint64_t{4} * kSide * kSide * 3);
  // Held batches stay intact while the ring grows under them, up to max_prefetch.
  std::vector<Batch> held;
  std::vector<std::vector<uint8_t>> copies;
  for (int i = 0; i < 5; ++i) {
    auto b = l.Next();
    REQUIRE(b.ok());
    REQUIRE(*b);
    copies.emplace_back(b->images(), b->images() + b->image_bytes());
    held.push_back(*b);
  }
  st = l.Stats();
  CHECK(st.prefetch == 5);
  CHECK(st.ring_bytes == 5 * slot);
  CHECK(st.tuning.find("slot") != std::string::npos);  // says what the ring did
  for (size_t i = 0; i < held.size(); ++i) {
    CHECK(std::equal(copies[i].begin(), copies[i].end(), held[i].images()));
    CHECK(held[i].number() == i);
  }
  auto starved = l.Next();  // the budget is spent: the same clear error as a fixed ring's
  CHECK(starved.status().code() == StatusCode::kResourceExhausted);
  CHECK(starved.status().message().find("all 5 prefetch slots") != std::string::npos);
  held.clear();
  auto next = l.Next();  // the batch the refusal did not consume
  REQUIRE(next.ok());
  CHECK(next->number() == 5);
}

TEST_CASE("prefetch=auto grows by exactly what a consumer holding every batch needs") {
  // Regression: a batch that became ready while the ring grew was taken for another starved
  // wait, and the ring grew again, up to its limit and a refusal, with 2 batches held.
  TempDir dir;
  auto archive = MakeRawArchive(dir / "a", 36);
  for (int round = 0; round < 200; ++round) {
    LoaderOptions o = CopyOptions(4, LoaderOptions::kAutoWorkers);
    o.prefetch = LoaderOptions::kAutoPrefetch;
    auto loader = Loader::Create(archive, o);
    REQUIRE(loader.ok());
    REQUIRE((*loader)->StartEpoch(0).ok());
    std::vector<Batch> held;
    for (;;) {
      auto b = (*loader)->Next();
      REQUIRE(b.ok());
      if (!*b) break;
      held.push_back(*b);
      REQUIRE((*loader)->Stats().prefetch <= int(held.size()) + 1);
    }
    REQUIRE(held.size() == 9);
  }
}

TEST_CASE("prefetch=auto gives slots and their memory back once a slower consumer is fed") {
  TempDir dir;
  auto archive = MakeRawArchive(dir / "a", 200);
  LoaderOptions o = CopyOptions(2, 2);
  o.prefetch = LoaderOptions::kAutoPrefetch;
  o.max_prefetch = 6;
  // Calm means waiting at most half the target: a loose target keeps a scheduler hiccup
  // (TSan, a loaded CI machine) from resetting the calm spell; this test is about shrinking.
  o.wait_target = 0.5;
  auto loader = Loader::Create(archive, o);
  REQUIRE(loader.ok());
  Loader& l = **loader;
  REQUIRE(l.StartEpoch(0).ok());
  std::vector<Batch> held;
  for (int i = 0; i < 6; ++i) held.push_back(*l.Next());  // grow the ring to 6
  const EpochStats grown = l.Stats();
  REQUIRE(grown.prefetch == 6);
  held.clear();
  // A consumer slower than the workers: a ready batch is always to spare, so the ring gives
  // slots back, one per calm spell, down to 2 (and no further). Each calm spell is 4 tuning
  // windows, so 4 slots take about 80 batches; the epochs repeat (the ring's depth carries
  // over) so that a window lost to a scheduling delay only postpones the shrink.
  EpochStats st = grown;
  for (uint64_t epoch = 0; epoch < 10 && st.prefetch > 2; ++epoch) {
    if (epoch > 0) REQUIRE(l.StartEpoch(epoch).ok());
    for (;;) {
      auto b = l.Next();
      REQUIRE(b.ok());
      if (!*b) break;
      b->Release();
      REQUIRE(l.Stats().prefetch >= 2);
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    st = l.Stats();
    CHECK(st.ring_full_seconds > 0);  // the workers waited for the consumer, and it shows
  }
  CHECK(st.prefetch == 2);
  CHECK(st.ring_bytes == grown.ring_bytes / 3);
  // The delivered data is unaffected: a full epoch after the shrink checks every sample.
  const Delivered d = ReadEpoch(l, 20);
  CHECK(d.indices.size() == 200);
}

TEST_CASE("prefetch=auto delivers what a fixed ring does, in threads and processes") {
  TempDir dir;
  auto archive = MakeRawArchive(dir / "a", 97);
  for (WorkerMode mode : {WorkerMode::kThreads, WorkerMode::kProcesses}) {
    LoaderOptions fixed = CopyOptions(8, 2);
    fixed.shuffle = true;
    fixed.seed = 9;
    fixed.mode = mode;
    LoaderOptions tuned = fixed;
    tuned.prefetch = LoaderOptions::kAutoPrefetch;
    tuned.workers = LoaderOptions::kAutoWorkers;
    tuned.max_workers = 2;
    auto a = Loader::Create(archive, fixed);
    auto b = Loader::Create(archive, tuned);
    REQUIRE(a.ok());
    REQUIRE(b.ok());
    for (uint64_t e = 0; e < 2; ++e) CHECK(ReadEpoch(**a, e).indices == ReadEpoch(**b, e).indices);
    // Holding batches grows a shared (process-mode) ring too; the held ones stay intact.
    REQUIRE((*b)->StartEpoch(2).ok());
    std::vector<Batch> held;
    for (int i = 0; i < 4; ++i) held.push_back(*(*b)->Next());
    for (const Batch& h : held) {
      for (uint32_t j = 0; j < h.size(); ++j) CHECK(h.images()[j * 108] == h.indices()[j] % 251);
    }
  }
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

TEST_CASE("run_ahead takes no slot the epoch in progress needs, even when batches are held") {
  TempDir dir;
  auto archive = MakeRawArchive(dir / "a", 40);  // 10 batches of 4
  LoaderOptions o = CopyOptions(4, 2);
  o.prefetch = LoaderOptions::kAutoPrefetch;  // grows while the consumer holds every batch
  auto loader = Loader::Create(archive, o);
  REQUIRE(loader.ok());
  Loader& l = **loader;
  for (uint64_t epoch = 0; epoch < 3; ++epoch) {
    REQUIRE(l.StartEpoch(epoch).ok());
    std::vector<Batch> held;
    for (;;) {
      auto b = l.Next();
      REQUIRE(b.ok());
      if (!*b) break;
      CHECK(b->epoch() == epoch);
      held.push_back(*b);
    }
    REQUIRE(held.size() == 10);
    for (const Batch& h : held) {
      for (uint32_t j = 0; j < h.size(); ++j) CHECK(h.images()[j * 108] == h.indices()[j] % 251);
    }
  }
}

TEST_CASE("prefetch=auto refuses a ring budget too small for two slots, naming it") {
  TempDir dir;
  auto archive = MakeRawArchive(dir / "a", 10);
  LoaderOptions o = CopyOptions(4, 1);
  o.transform.crop = Crop::kSquash;
  o.transform.size = 1024;  // 12 MiB per batch of 4
  o.prefetch = LoaderOptions::kAutoPrefetch;
  o.ring_mb = 16;
  auto loader = Loader::Create(archive, o);
  REQUIRE_FALSE(loader.ok());
  CHECK(loader.status().message().find("ring_mb=16") != std::string::npos);
  o.ring_mb = 32;
  CHECK(Loader::Create(archive, o).ok());
}

// [no-tsan]: TSan's mmap interceptor counts the zero pages mapped by the SIGBUS handler as a
// write racing with the other workers' reads of the same (lost) pages.
TEST_CASE("a shard truncated on disk while mapped is an error naming it, never a SIGBUS",
          "[no-tsan]") {
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
      REQUIRE(loader.ok());
      REQUIRE((*loader)->StartEpoch(0).ok());
      REQUIRE((*loader)->Next().ok());
      // Another process cuts the file short under the mapping.
      REQUIRE(::truncate(shard.c_str(), 64 << 10) == 0);
      Status error;
      for (;;) {
        auto b = (*loader)->Next();
        if (!b.ok()) {
          error = b.status();
          break;
        }
        if (!*b) break;
      }
      REQUIRE_FALSE(error.ok());  // the epoch did not end as if nothing happened
      CHECK(error.message().find("changed on disk while in use") != std::string::npos);
      CHECK(error.message().find(shard) != std::string::npos);
      CHECK(error.message().find("65536 bytes now") != std::string::npos);
      // verify's path says the same, and the archive object stays usable for the message.
      CHECK(archive->VerifyRecord(599).code() == StatusCode::kCorrupt);
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
