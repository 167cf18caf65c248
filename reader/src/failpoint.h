// Failpoints: faults the tests switch on to reach error paths that healthy data cannot (a
// resizer that throws, a decoder that hangs). Read once from the environment variable
// SHARDFEED_FAILPOINTS, a comma-separated list of NAME=SAMPLE:
//   decode_throw=I   decoding sample I throws std::runtime_error (an exception in a worker)
//   decode_hang=I    decoding sample I sleeps for an hour (a stuck worker)
// Unset (the normal case), each check is one comparison with a constant.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <string>

namespace shardfeed::reader {

struct Failpoints {
  static constexpr uint64_t kOff = ~uint64_t{0};
  std::atomic<uint64_t> decode_throw{kOff};
  std::atomic<uint64_t> decode_hang{kOff};

  static Failpoints& Get() {
    static Failpoints* fp = [] {
      auto* f = new Failpoints();
      f->Reload();
      return f;
    }();
    return *fp;
  }

  // Re-reads SHARDFEED_FAILPOINTS (tests change it within one process).
  void Reload() {
    decode_throw = kOff;
    decode_hang = kOff;
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
      }
      pos = end + 1;
    }
  }
};

}  // namespace shardfeed::reader
