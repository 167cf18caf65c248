// Helpers for the loader's tests.
#pragma once

#include <catch.hpp>
#include <chrono>
#include <cstdint>
#include <thread>

#include "shardfeed/reader/loader.h"

namespace shardfeed::testing {

// Polls (no sleep-and-hope; bounded at 60 s) until the workers have begun `want` batches of
// the epoch expected next (run_ahead): they do as soon as every sample of the epoch in
// progress is handed out and a slot is free.
inline void AwaitRunAhead(reader::Loader& loader, uint64_t want) {
  for (int i = 0; i < 60000 && loader.Stats().run_ahead_batches < want; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  REQUIRE(loader.Stats().run_ahead_batches == want);
}

}  // namespace shardfeed::testing
