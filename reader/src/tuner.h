// The tuner of workers="auto" and prefetch="auto" (internal to the loader).
//
// Contract. The loader calls Tuner::OnBatch with mu held after every batch it delivers, giving
// the epoch's running totals (EpochStats) and the ready batches to spare at that moment. Every
// kWindow batches the tuner closes a window and Decide() moves at most one of the two bounds it
// is given: the workers that may claim work (`active_workers`) and the ring's depth (`depth`).
// It changes timing only, never what is delivered. Decide() is a pure function of the window's
// figures and the tuner's own memory (calm spells, undone shrinks): no clock, no lock, no I/O,
// so tests drive it with simulated steps (tests/reader/tuner_test.cpp).
//
// The rule (docs/DESIGN.md, "Tuned online"): while the consumer waits more than wait_target of
// its time, wake a worker (double them while it waits more than half its time) or, when workers
// stand idle because every slot is full, deepen the ring. While it is calm, put a worker to
// sleep when the others' measured load fits in fewer workers (spare cores belong to the
// training process: the fewest workers that keep the wait under target), else give a slot back
// after a calm spell.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace shardfeed::reader {

// What one tuning window measured (seconds), all over the same span of `wall` seconds.
struct TuneWindowFigures {
  double wait = 0;          // the consumer blocked in Next()
  double consumer = 0;      // the consumer's own time between batches
  double busy = 0;          // worker time spent reading, decoding, resizing (summed over workers)
  double wall = 0;          // the window's length
  double ring_full = 0;     // worker time idle because every slot was taken
  uint32_t lead_min = ~0u;  // fewest ready batches to spare at a delivery in the window
  double samples = 0;       // samples the workers completed in the window (busy's work)
  double wait_fraction() const { return wait + consumer > 0 ? wait / (wait + consumer) : 0; }
};

struct TunerConfig {
  bool auto_workers = false, auto_prefetch = false;
  int max_workers = 1;        // workers started (the most that may wake)
  double wait_target = 0.02;  // LoaderOptions::wait_target
  uint32_t batch_size = 1;
};

class Tuner {
 public:
  static constexpr uint64_t kWindow = 4;  // delivered batches per decision
  // A worker sleeps when the others would be busy at most this fraction of the consumer's step
  // decoding a batch: per-batch cost (worker time per sample completed, times the batch size)
  // over (workers - 1) against the consumer's own time per batch, both measured over the window
  // (the fewest workers that keep up, with a tenth to spare for uneven steps). Measured per
  // sample decoded, not per batch delivered, so a burst of batches decoded earlier (the ring
  // full at an epoch's start) is no evidence of spare workers. Each time a sleep has to be undone
  // (the consumer waited within kUndoWindows windows of it) the bar drops by kSleepLoadStep, down
  // to kSleepLoadMin, so the count settles instead of swinging.
  static constexpr double kSleepLoad = 0.9, kSleepLoadStep = 0.1, kSleepLoadMin = 0.5;
  static constexpr uint32_t kUndoWindows = 3;

  using Config = TunerConfig;
  explicit Tuner(const Config& config = Config()) : config_(config) {}
  const Config& config() const { return config_; }

  // Running totals of the epoch at a delivery (EpochStats fields), for window bookkeeping.
  struct Totals {
    double wait = 0, consumer = 0, busy = 0, ring_full = 0, samples = 0;
  };
  // After each delivered batch: true when a window closed, with its figures in `*window`.
  bool OnBatch(const Totals& totals, std::chrono::steady_clock::time_point now, uint32_t lead,
               TuneWindowFigures* window);
  void Restart() { batches_ = 0; }  // the totals restart (a new epoch): so does the window

  // One decision over a closed window: moves `*active_workers` (1..max_workers) and `*depth`
  // (2..ring_cap) by at most one step, and returns what it did and why (EpochStats::tuning).
  std::string Decide(const TuneWindowFigures& w, uint32_t ring_cap, int* active_workers,
                     uint32_t* depth);
  double sleep_load() const { return sleep_load_; }

 private:
  Config config_;
  // The open window: batches delivered in it, and the totals and time it started at.
  uint64_t batches_ = 0;
  Totals start_;
  std::chrono::steady_clock::time_point start_time_;
  uint32_t lead_min_ = ~0u;
  // prefetch="auto": calm windows in a row, and how many it takes to give a slot back.
  uint32_t calm_windows_ = 0, shrink_after_ = 4;
  bool shrunk_ = false;  // the ring has given a slot back since it last grew
  // workers="auto": the load under which a worker may sleep, and windows since the last sleep.
  double sleep_load_ = kSleepLoad;
  uint32_t since_sleep_ = ~0u;
};

}  // namespace shardfeed::reader
