// base/cancel.h: the token and the sleep every retry's back-off takes.
#include "shardfeed/base/cancel.h"

#include <catch2/catch.hpp>
#include <chrono>
#include <thread>

using namespace shardfeed;

TEST_CASE("a cancel ends a sleep at once and is sticky", "[base]") {
  CHECK(SleepUnlessCancelled(0.001, nullptr));  // no token: a plain sleep
  CancelToken token;
  CHECK_FALSE(Cancelled(&token));
  CHECK(SleepUnlessCancelled(0.001, &token));
  // An hour's sleep ended by a cancel from another thread (a failure is a hang: CTest's timeout).
  std::thread canceller([&token] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    token.Cancel();
  });
  CHECK_FALSE(SleepUnlessCancelled(3600, &token));
  canceller.join();
  CHECK(Cancelled(&token));
  CHECK_FALSE(SleepUnlessCancelled(3600, &token));  // still cancelled: returns at once
  CHECK_FALSE(Cancelled(nullptr));
}
