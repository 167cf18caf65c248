// Helpers for the loader's tests.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch.hpp>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <thread>

#include "../../reader/src/failpoint.h"
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

// The decode_gate failpoint (reader/src/failpoint.h): the first decode of sample `index` in each
// process is held until Release(). Set up before the loader is created (worker processes read
// the environment when they start); switched off again when the gate goes out of scope.
class DecodeGate {
 public:
  DecodeGate(const std::string& dir, uint64_t index) : path_(dir + "/gate") {
    REQUIRE(::mkfifo(path_.c_str(), 0600) == 0);
    ::setenv("SHARDFEED_FAILPOINT_GATE", path_.c_str(), 1);
    ::setenv("SHARDFEED_FAILPOINTS", ("decode_gate=" + std::to_string(index)).c_str(), 1);
    reader::Failpoints::Get().Reload();
  }
  ~DecodeGate() {
    Release();
    ::unsetenv("SHARDFEED_FAILPOINTS");
    ::unsetenv("SHARDFEED_FAILPOINT_GATE");
    reader::Failpoints::Get().Reload();
  }
  // Polls (bounded at 60 s) until a decode is held at the gate: opening the FIFO for writing
  // succeeds only once its reader, the held decode, has it open.
  void AwaitHeld() {
    for (int i = 0; i < 60000 && fd_ < 0; ++i) {
      fd_ = ::open(path_.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
      if (fd_ < 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    REQUIRE(fd_ >= 0);
  }
  void Release() {  // the held decode reads end-of-file and goes on
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  std::string path_;
  int fd_ = -1;
};

}  // namespace shardfeed::testing
