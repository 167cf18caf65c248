// Failpoints: faults the tests switch on to reach error paths that healthy data cannot (a
// resizer that throws, a decoder that hangs). Read once from the environment variable
// SHARDFEED_FAILPOINTS, a comma-separated list of NAME=SAMPLE:
//   decode_throw=I   decoding sample I throws std::runtime_error (an exception in a worker)
//   decode_hang=I    decoding sample I sleeps for an hour (a stuck worker)
//   decode_gate=I    the first decode of sample I in this process waits at a gate: it opens the
//                    FIFO named by SHARDFEED_FAILPOINT_GATE for reading (which blocks until the
//                    test opens it for writing: the test then knows the decode is held) and
//                    reads it to its end (until the test closes it: the release). No sleep.
//   io_error_once=I  the first decode of sample I in this process fails with kIOError, and the
//                    loader takes its archive's read errors as a remote one's (that may pass:
//                    the batch is read again, not consumed)
//   thread_start_fail=W  starting worker thread W (thread mode) throws std::system_error, as
//                    std::thread does when the system has no thread to give
//   finish_gate=B    the run that completes batch B (by its number in the epoch) waits, once a
//                    process, between FinishRun's two locked sections, at the FIFO named by
//                    SHARDFEED_FAILPOINT_FINISH_GATE, as decode_gate does (the race a StartEpoch
//                    there used to win)
// Unset (the normal case), each check is one comparison with a constant.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <string>

namespace shardfeed::reader {

struct Failpoints {
  static constexpr uint64_t kOff = ~uint64_t{0};
  std::atomic<uint64_t> decode_throw{kOff};
  std::atomic<uint64_t> decode_hang{kOff};
  std::atomic<uint64_t> decode_gate{kOff};
  std::atomic<uint64_t> io_error_once{kOff};
  std::atomic<bool> io_error_used{false};
  std::atomic<uint64_t> thread_start_fail{kOff};
  std::atomic<uint64_t> finish_gate{kOff};
  std::atomic<bool> gate_used{false}, finish_gate_used{false};
  std::string gate_path;  // written by Reload only, before any loader of the test exists
  std::string finish_gate_path;

  static Failpoints& Get() {
    static Failpoints* fp = [] {
      auto* f = new Failpoints();
      f->Reload();
      return f;
    }();
    return *fp;
  }

  // decode_gate: held until the test releases the gate (once per process).
  void WaitAtGate() { WaitAtFifo(gate_used, gate_path); }
  void WaitAtFinishGate() { WaitAtFifo(finish_gate_used, finish_gate_path); }
  static void WaitAtFifo(std::atomic<bool>& used, const std::string& path) {
    if (used.exchange(true) || path.empty()) return;
    int fd;
    do {
      fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    } while (fd < 0 && errno == EINTR);
    if (fd < 0) return;
    char c;
    for (;;) {
      const ssize_t n = ::read(fd, &c, 1);
      if (n > 0 || (n < 0 && errno == EINTR)) continue;
      break;
    }
    ::close(fd);
  }

  // Re-reads SHARDFEED_FAILPOINTS (tests change it within one process).
  void Reload() {
    decode_throw = kOff;
    decode_hang = kOff;
    decode_gate = kOff;
    io_error_once = kOff;
    io_error_used = false;
    thread_start_fail = kOff;
    finish_gate = kOff;
    gate_used = false;
    finish_gate_used = false;
    const char* gate = std::getenv("SHARDFEED_FAILPOINT_GATE");
    gate_path = gate ? gate : "";
    const char* fgate = std::getenv("SHARDFEED_FAILPOINT_FINISH_GATE");
    finish_gate_path = fgate ? fgate : "";
    const char* env = std::getenv("SHARDFEED_FAILPOINTS");
    std::string spec = env ? env : "";
    size_t pos = 0;
    while (pos < spec.size()) {
      size_t end = spec.find(',', pos);
      if (end == std::string::npos) end = spec.size();
      std::string item = spec.substr(pos, end - pos);
      size_t eq = item.find('=');
      if (eq != std::string::npos) {
        uint64_t v = std::strtoull(item.c_str() + eq + 1, nullptr, 10);
        if (item.compare(0, eq, "decode_throw") == 0) decode_throw = v;
        if (item.compare(0, eq, "decode_hang") == 0) decode_hang = v;
        if (item.compare(0, eq, "decode_gate") == 0) decode_gate = v;
        if (item.compare(0, eq, "io_error_once") == 0) io_error_once = v;
        if (item.compare(0, eq, "thread_start_fail") == 0) thread_start_fail = v;
        if (item.compare(0, eq, "finish_gate") == 0) finish_gate = v;
      }
      pos = end + 1;
    }
  }
};

}  // namespace shardfeed::reader
