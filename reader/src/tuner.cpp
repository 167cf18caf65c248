// workers="auto" and prefetch="auto": one decision per window of delivered batches (tuner.h).
#include "tuner.h"

#include <algorithm>
#include <iomanip>
#include <sstream>

namespace shardfeed::reader {

bool Tuner::OnBatch(const Totals& totals, std::chrono::steady_clock::time_point now, uint32_t lead,
                    TuneWindowFigures* window) {
  auto restart = [&] {
    batches_ = 1;
    start_ = totals;
    start_time_ = now;
    lead_min_ = ~0u;
  };
  if (batches_++ == 0) {
    restart();
    return false;
  }
  lead_min_ = std::min(lead_min_, lead);
  if (batches_ <= kWindow) return false;
  window->wait = totals.wait - start_.wait;
  window->consumer = totals.consumer - start_.consumer;
  window->busy = totals.busy - start_.busy;
  window->ring_full = totals.ring_full - start_.ring_full;
  window->samples = totals.samples - start_.samples;
  window->wall = std::chrono::duration<double>(now - start_time_).count();
  window->lead_min = lead_min_;
  restart();
  return true;
}

std::string Tuner::Decide(const TuneWindowFigures& w, uint32_t ring_cap, int* active_workers,
                          uint32_t* depth) {
  int& active = *active_workers;
  const double fraction = w.wait_fraction();
  const bool can_wake = config_.auto_workers && active < config_.max_workers;
  const bool can_grow = config_.auto_prefetch && *depth < ring_cap;
  // Workers idle on a full ring for a tenth of their time: a deeper ring lets them run ahead.
  const bool ring_bound = w.ring_full > 0.1 * w.wall * active;
  std::ostringstream why;
  why << std::fixed << std::setprecision(1) << "consumer waited " << 100 * fraction << "% over "
      << kWindow << " batches (target " << 100 * config_.wait_target << "%), workers busy "
      << (w.wall > 0 ? w.busy / w.wall : 0) << " of " << active << ", idle on a full ring "
      << (w.wall > 0 ? w.ring_full / w.wall : 0) << ", " << *depth << " slots";
  std::string did =
      "kept " + std::to_string(active) + " workers, " + std::to_string(*depth) + " slots";
  if (since_sleep_ != ~0u) ++since_sleep_;
  if (fraction > config_.wait_target) {
    calm_windows_ = 0;
    // Starved for most of the window, the decode rate is short, not the depth: a deeper ring
    // absorbs uneven steps but cannot make up a deficit, so a worker that can wake comes first
    // (the next window grows the ring if waiting and idling on a full ring persist).
    const bool rate_short = can_wake && fraction > 0.5;
    if (can_grow && !rate_short && (ring_bound || (!can_wake && w.ring_full > 0))) {
      ++*depth;
      did = "the ring grew to " + std::to_string(*depth) + " slots";
      if (shrunk_) shrink_after_ = std::min<uint32_t>(2 * shrink_after_, 64);
      shrunk_ = false;
    } else if (can_wake) {
      // Starved for most of the window: double (a many-core machine ramps in a few windows);
      // otherwise one more.
      const int wake = fraction > 0.5 ? active : 1;
      active = std::min(config_.max_workers, active + wake);
      did = wake == 1 ? "woke a worker" : "woke " + std::to_string(wake) + " workers";
      if (since_sleep_ <= kUndoWindows) {  // the last sleep was one too many
        sleep_load_ = std::max(kSleepLoadMin, sleep_load_ - kSleepLoadStep);
        since_sleep_ = ~0u;
      }
    }
  } else if (fraction <= config_.wait_target / 2) {
    ++calm_windows_;
    // The fewest workers that keep up: one fewer would decode a batch in at most sleep_load of
    // the consumer's step (spare cores belong to the training process).
    const double step = w.consumer / kWindow;
    const double batch_cost = w.samples > 0 ? w.busy / w.samples * config_.batch_size : 0;
    if (config_.auto_workers && active > 1 && w.samples > 0 &&
        batch_cost < (active - 1) * step * sleep_load_) {
      --active;
      since_sleep_ = 0;
      did = "one worker sleeps";
    } else if (config_.auto_prefetch && *depth > 2 && w.lead_min >= 1 &&
               calm_windows_ >= shrink_after_) {
      --*depth;  // a ready batch was always to spare: one slot fewer still keeps up
      calm_windows_ = 0;
      shrunk_ = true;
      did = "the ring gave a slot back (" + std::to_string(*depth) + " slots)";
    }
  } else {
    calm_windows_ = 0;
  }
  return why.str() + ": " + did;
}

}  // namespace shardfeed::reader
