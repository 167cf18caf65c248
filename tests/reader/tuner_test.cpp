// The tuner's rule, driven by simulated steps (no clock, no threads): each window's figures are
// what a consumer taking `step` seconds per batch and workers needing `cost` seconds of work per
// batch would measure, so the outcome does not depend on the speed of the machine running it.
#include "../../reader/src/tuner.h"

#include <algorithm>
#include <catch.hpp>
#include <string>

namespace shardfeed::reader {
namespace {

constexpr uint32_t kBatch = 64;

// One window of Tuner::kWindow batches with `n` workers. `cost_at(n)`: worker-seconds per batch
// with n workers awake (a constant, or one that grows with contention).
template <typename Cost>
TuneWindowFigures Simulate(double step, Cost cost_at, int n, uint32_t depth) {
  const double k = Tuner::kWindow, cost = cost_at(n);
  const double per_batch = std::max(step, cost / n);  // the slower of consumer and supply
  TuneWindowFigures w;
  w.consumer = k * step;
  w.wait = k * (per_batch - step);
  w.wall = k * per_batch;
  w.busy = k * cost;
  w.ring_full = n * w.wall - w.busy;  // a worker with nothing to claim waits on the full ring
  w.lead_min = cost / n < step ? depth - 1 : 0;
  w.samples = k * kBatch;
  return w;
}

struct Outcome {
  int workers;
  uint32_t depth;
  int sleeps;  // "one worker sleeps" decisions
  double last_wait_fraction;
};

template <typename Cost>
Outcome Settle(double step, Cost cost_at, int max_workers, int start_workers = 1,
               int windows = 200) {
  TunerConfig c;
  c.auto_workers = c.auto_prefetch = true;
  c.max_workers = max_workers;
  c.batch_size = kBatch;
  Tuner t(c);
  int n = start_workers;
  uint32_t depth = 2;
  Outcome o{};
  for (int i = 0; i < windows; ++i) {
    const TuneWindowFigures w = Simulate(step, cost_at, n, depth);
    o.last_wait_fraction = w.wait_fraction();
    const std::string did = t.Decide(w, 16, &n, &depth);
    o.sleeps += did.find("one worker sleeps") != std::string::npos;
    REQUIRE(n >= 1);
    REQUIRE(n <= max_workers);
  }
  o.workers = n;
  o.depth = depth;
  return o;
}

TEST_CASE("workers=auto settles on the fewest workers that keep the wait under target") {
  // Regression: a consumer taking 150 ms per batch that one worker feeds with room to spare
  // (120 ms of decoding per batch) kept the 2 workers its start-up ramp had woken.
  {
    const Outcome o = Settle(
        0.150, [](int) { return 0.120; }, 8, 2);
    CHECK(o.workers == 1);
    CHECK(o.last_wait_fraction == 0);
  }
  // Steps up to 200 ms against per-batch costs from a tenth of a step to six steps: the count
  // reached keeps the consumer fed (no wait), and one fewer would be busy more than the sleep
  // bar (kSleepLoad) of the time, i.e. it is the fewest with a tenth to spare.
  for (double step : {0.010, 0.050, 0.100, 0.150, 0.200}) {
    for (double ratio : {0.1, 0.5, 0.8, 0.89, 0.95, 1.0, 1.3, 2.5, 4.2, 6.0}) {
      for (int start : {1, 8}) {  // from the first worker, or all of them awake
        const double cost = ratio * step;
        const Outcome o = Settle(
            step, [cost](int) { return cost; }, 8, start);
        INFO("step " << step << " cost " << cost << " start " << start << " -> " << o.workers);
        CHECK(o.last_wait_fraction <= 0.02);
        CHECK(cost / o.workers <= step * (1 + 1e-9));
        if (o.workers > 1) CHECK(cost / (o.workers - 1) >= Tuner::kSleepLoad * step);
        CHECK(o.sleeps <= 8);  // settles: no endless sleep-and-wake
      }
    }
  }
}

TEST_CASE("workers=auto stops swinging when a sleep has to be undone") {
  // Work that costs more per batch with fewer workers awake (a worker alone loses the cache
  // another kept warm): the measured load says one worker suffices, and it does not. The sleep
  // is undone, the bar drops, and the count settles at 2.
  auto cost_at = [](int n) { return n == 1 ? 0.110 : 0.085; };
  const Outcome o = Settle(0.100, cost_at, 4, 1, 400);
  CHECK(o.workers == 2);
  CHECK(o.sleeps <= 3);
}

TEST_CASE("workers=auto takes a burst of ready batches for no evidence of spare workers") {
  // A data-bound consumer (no step of its own) at an epoch's start, where the ring is full of
  // batches decoded earlier: the window is calm, and the workers' busy time small against it,
  // but per batch decoded they are as busy as ever. Regression: the load was measured per
  // batch delivered, and a worker slept.
  TunerConfig c;
  c.auto_workers = true;
  c.max_workers = 2;
  c.batch_size = kBatch;
  Tuner t(c);
  int n = 2;
  uint32_t depth = 8;
  TuneWindowFigures burst;
  burst.consumer = 4e-5;  // the loop's own overhead
  burst.wait = 0;
  burst.wall = 5e-5;
  burst.busy = 2e-5;  // one sample's worth of decoding happened meanwhile
  burst.samples = 1;
  burst.lead_min = 4;
  t.Decide(burst, 8, &n, &depth);
  CHECK(n == 2);
}

TEST_CASE("workers=auto never sleeps a worker while the consumer waits") {
  TunerConfig c;
  c.auto_workers = true;
  c.max_workers = 4;
  Tuner t(c);
  int n = 4;
  uint32_t depth = 4;
  const TuneWindowFigures w = Simulate(
      0.010, [](int) { return 0.050; }, n, depth);
  REQUIRE(w.wait_fraction() > 0.02);
  t.Decide(w, 4, &n, &depth);
  CHECK(n == 4);
}

TEST_CASE("prefetch=auto gives a slot back after each calm spell, down to 2") {
  // The rule the loader-level test exercises with a real (sleeping) consumer, without a clock:
  // calm windows (no wait, a ready batch always to spare) give one slot back per spell of 4.
  TunerConfig c;
  c.auto_prefetch = true;
  Tuner t(c);
  int n = 2;
  uint32_t depth = 6;
  TuneWindowFigures calm;
  calm.consumer = 0.040;
  calm.wall = 0.040;
  calm.busy = 0.010;
  calm.ring_full = 0.070;
  calm.lead_min = 1;
  int windows = 0;
  for (; windows < 100 && depth > 2; ++windows) t.Decide(calm, 6, &n, &depth);
  CHECK(depth == 2);
  CHECK(windows == 4 * 4);  // 4 slots, a spell of 4 windows each
  for (int i = 0; i < 20; ++i) t.Decide(calm, 6, &n, &depth);
  CHECK(depth == 2);  // never below 2
  // Waiting with workers idle on a full ring grows it again, and the next calm spell that
  // shrinks it must be twice as long (a shrink that had to be undone).
  TuneWindowFigures starved = calm;
  starved.wait = 0.010;
  starved.lead_min = 0;
  CHECK(t.Decide(starved, 6, &n, &depth).find("the ring grew to 3") != std::string::npos);
  windows = 0;
  for (; windows < 100 && depth > 2; ++windows) t.Decide(calm, 6, &n, &depth);
  CHECK(windows == 8);
}

}  // namespace
}  // namespace shardfeed::reader
