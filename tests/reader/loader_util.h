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
#include <utility>
#include <vector>

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

// A FIFO a failpoint holds a worker at (reader/src/failpoint.h): the held worker opens it for
// reading and waits for end-of-file.
class FifoGate {
 public:
  explicit FifoGate(std::string path) : path_(std::move(path)) {
    REQUIRE(::mkfifo(path_.c_str(), 0600) == 0);
  }
  ~FifoGate() { Release(); }
  FifoGate(const FifoGate&) = delete;
  FifoGate& operator=(const FifoGate&) = delete;
  // Polls (bounded at 60 s) until a worker is held at the gate: opening the FIFO for writing
  // succeeds only once its reader, the held worker, has it open.
  void AwaitHeld() {
    for (int i = 0; i < 60000 && fd_ < 0; ++i) {
      fd_ = ::open(path_.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
      if (fd_ < 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    REQUIRE(fd_ >= 0);
  }
  void Release() {  // the held worker reads end-of-file and goes on
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
};

// Failpoints switched on for one scope: `spec` as SHARDFEED_FAILPOINTS, `gates` as (environment
// variable, FIFO path). Set up before the loader is created (worker processes read the
// environment when they start); switched off again when it goes out of scope.
class FailpointScope {
 public:
  FailpointScope(const std::string& spec, std::vector<std::pair<std::string, std::string>> gates)
      : gates_(std::move(gates)) {
    for (const auto& [var, path] : gates_) ::setenv(var.c_str(), path.c_str(), 1);
    ::setenv("SHARDFEED_FAILPOINTS", spec.c_str(), 1);
    reader::Failpoints::Get().Reload();
  }
  ~FailpointScope() {
    ::unsetenv("SHARDFEED_FAILPOINTS");
    for (const auto& [var, path] : gates_) ::unsetenv(var.c_str());
    reader::Failpoints::Get().Reload();
  }

 private:
  std::vector<std::pair<std::string, std::string>> gates_;
};

// The decode_gate failpoint: the first decode of sample `index` in each process is held until
// Release().
class DecodeGate : public FifoGate {
 public:
  DecodeGate(const std::string& dir, uint64_t index)
      : FifoGate(dir + "/gate"),
        scope_("decode_gate=" + std::to_string(index), {{"SHARDFEED_FAILPOINT_GATE", path()}}) {}
  ~DecodeGate() { Release(); }

 private:
  FailpointScope scope_;
};

}  // namespace shardfeed::testing
