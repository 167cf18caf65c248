#include "shardfeed/base/cancel.h"

#include <algorithm>
#include <chrono>
#include <thread>

namespace shardfeed {

bool SleepUnlessCancelled(double seconds, const CancelToken* cancel) {
  using Clock = std::chrono::steady_clock;
  const auto until = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                        std::chrono::duration<double>(std::max(0.0, seconds)));
  for (auto now = Clock::now(); now < until; now = Clock::now()) {
    if (Cancelled(cancel)) return false;
    std::this_thread::sleep_for(
        std::min<Clock::duration>(until - now, std::chrono::milliseconds(50)));
  }
  return !Cancelled(cancel);
}

}  // namespace shardfeed
