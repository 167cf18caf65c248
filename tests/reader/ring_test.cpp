// The batch ring as the consumer sees it: held and kept batches, the ring's tuned depth
// (prefetch=auto) growing and giving memory back, slots beyond the ring (kept_mb), run-ahead
// taking no slot the epoch in progress needs.
#include <algorithm>
#include <chrono>
#include <thread>
#include <vector>

#include "raw_loader.h"
#include "shardfeed/reader/loader.h"
#include "test_util.h"

namespace shardfeed::reader {
namespace {

using testing::TempDir;

TEST_CASE("a held batch keeps its memory; a consumer holding every slot gets slots beyond") {
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
  CHECK((*loader)->Stats().kept_slots == 0);  // one batch held: the ring's other slot serves
  // Holding both slots: regression, this was an error ("all 2 prefetch slots are held").
  auto second = (*loader)->Next();
  REQUIRE(second.ok());
  auto third = (*loader)->Next();
  REQUIRE(third.ok());
  CHECK(third->number() == 12);
  CHECK((*loader)->Stats().kept_slots == 1);
  CHECK(std::equal(copy.begin(), copy.end(), held->images()));
  // Released, the slot beyond the ring gives its memory back.
  const uint64_t grown = (*loader)->Stats().ring_bytes;
  held->Release();
  second->Release();
  third->Release();
  REQUIRE((*loader)->Next().ok());  // gives back retired slots
  CHECK((*loader)->Stats().ring_bytes < grown);
}

TEST_CASE("a loop holding its first batch, and the last while it asks for the next, never stalls") {
  // Python's `for b in loader: keep = keep or b` holds the first batch for good, and `b` (the
  // previous batch) while next() runs. Regression: from the batch after the slot beyond the ring
  // was added, every freed slot retired (the ring above its depth) and no worker could claim one:
  // a Timeout after `timeout` seconds with no worker decoding.
  TempDir dir;
  auto archive = MakeRawArchive(dir / "a", 80);  // 20 batches of 4 an epoch
  for (WorkerMode mode : {WorkerMode::kThreads, WorkerMode::kProcesses}) {
    for (uint32_t prefetch : {2u, 3u, LoaderOptions::kAutoPrefetch}) {
      CAPTURE(int(mode), prefetch);
      LoaderOptions o = CopyOptions(4, 1);
      o.prefetch = prefetch;
      o.mode = mode;
      o.timeout = 20;
      auto loader = Loader::Create(archive, o);
      REQUIRE(loader.ok());
      for (uint64_t epoch = 0; epoch < 2; ++epoch) {
        REQUIRE((*loader)->StartEpoch(epoch).ok());
        std::vector<Batch> first;  // the first prefetch-1 batches, kept for good
        Batch previous;
        uint64_t n = 0;
        for (;;) {
          auto b = (*loader)->Next();
          INFO(b.status().ToString());
          REQUIRE(b.ok());
          if (!*b) break;
          REQUIRE(b->number() == n++);
          for (uint32_t j = 0; j < b->size(); ++j) {
            REQUIRE(b->images()[j * 108] == b->indices()[j] % 251);
          }
          const size_t keep = prefetch == LoaderOptions::kAutoPrefetch ? 15 : prefetch - 1;
          if (first.size() < keep) first.push_back(*b);
          previous = *b;
        }
        CHECK(n == 20);
        for (const Batch& h : first) {
          for (uint32_t j = 0; j < h.size(); ++j)
            CHECK(h.images()[j * 108] == h.indices()[j] % 251);
        }
      }
    }
  }
}

TEST_CASE("batches kept over several epochs never make iteration fail; past kept_mb, an error") {
  // A training loop that keeps every batch (for metrics, a list(loader), a view of one image):
  // DataLoader allows it, and so must the ring, with default options.
  TempDir dir;
  auto archive = MakeRawArchive(dir / "a", 60);  // 15 batches of 4 an epoch
  for (WorkerMode mode : {WorkerMode::kThreads, WorkerMode::kProcesses}) {
    CAPTURE(int(mode));
    LoaderOptions o = CopyOptions(4, LoaderOptions::kAutoWorkers);
    o.prefetch = LoaderOptions::kAutoPrefetch;
    o.mode = mode;
    auto loader = Loader::Create(archive, o);
    REQUIRE(loader.ok());
    std::vector<Batch> kept;
    for (uint64_t epoch = 0; epoch < 4; ++epoch) {
      REQUIRE((*loader)->StartEpoch(epoch).ok());
      for (;;) {
        auto b = (*loader)->Next();
        REQUIRE(b.ok());
        if (!*b) break;
        kept.push_back(*b);
      }
    }
    REQUIRE(kept.size() == 60);
    for (const Batch& h : kept) {
      for (uint32_t j = 0; j < h.size(); ++j) CHECK(h.images()[j * 108] == h.indices()[j] % 251);
    }
    CHECK((*loader)->Stats().kept_slots > 0);
  }
  // A cap of 1 MiB: slots of 4 x 512 x 512 x 3 bytes (3 MiB) cannot be kept beyond the ring.
  LoaderOptions o = CopyOptions(4, 2);
  o.transform.crop = Crop::kSquash;
  o.transform.size = 512;
  o.prefetch = 2;
  o.kept_mb = 1;
  auto loader = Loader::Create(archive, o);
  REQUIRE(loader.ok());
  auto a = (*loader)->Next();
  auto b = (*loader)->Next();
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  auto refused = (*loader)->Next();
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.status().code() == StatusCode::kResourceExhausted);
  CHECK(refused.status().message().find("kept_mb=1") != std::string::npos);
  b->Release();
  auto next = (*loader)->Next();  // the batch the refusal did not consume
  REQUIRE(next.ok());
  CHECK(next->number() == 2);
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
  auto beyond = l.Next();  // the budget is spent: a slot beyond the ring (kept_mb)
  REQUIRE(beyond.ok());
  CHECK(beyond->number() == 5);
  st = l.Stats();
  CHECK(st.prefetch == 5);
  CHECK(st.kept_slots == 1);
  CHECK(st.ring_bytes == 6 * slot);
  held.clear();
  auto next = l.Next();
  REQUIRE(next.ok());
  CHECK(next->number() == 6);
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
  // windows, so 4 slots take about 80 batches. "Slower" is made, not timed: before each Next
  // the consumer waits (polling Stats, bounded) until every slot of the ring holds a ready
  // batch (or the rest of the epoch does), so every delivery leaves one to spare, none waits,
  // and the workers idle on a full ring. Its step also sleeps a millisecond: not
  // synchronisation, a step long against Next's own few microseconds, so a window's wait stays
  // within the loose target. The epochs repeat (the depth carries over) so that a window lost
  // to a preemption inside Next only postpones the shrink.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  auto ring_full = [&](uint64_t left) {
    for (;;) {
      const EpochStats now = l.Stats();
      if (now.ready_batches >= std::min<uint64_t>(uint64_t(now.prefetch), left)) return true;
      if (std::chrono::steady_clock::now() > deadline) return false;  // the workers stopped
      std::this_thread::sleep_for(std::chrono::microseconds(200));    // a polling interval
    }
  };
  EpochStats st = grown;
  for (uint64_t epoch = 0; epoch < 10 && st.prefetch > 2; ++epoch) {
    if (epoch > 0) REQUIRE(l.StartEpoch(epoch).ok());
    for (uint64_t delivered = 0;; ++delivered) {
      REQUIRE(ring_full(l.batches_per_epoch() - delivered));
      auto b = l.Next();
      REQUIRE(b.ok());
      if (!*b) break;
      b->Release();
      REQUIRE(l.Stats().prefetch >= 2);
      std::this_thread::sleep_for(std::chrono::milliseconds(1));  // the step (see above)
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

}  // namespace
}  // namespace shardfeed::reader
