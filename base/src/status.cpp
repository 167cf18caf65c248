#include "shardfeed/base/status.h"

#include <cstdio>
#include <cstdlib>

namespace shardfeed {

const char* StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return "OK";
    case StatusCode::kInvalidArgument:
      return "invalid argument";
    case StatusCode::kIOError:
      return "I/O error";
    case StatusCode::kCorrupt:
      return "corrupt";
    case StatusCode::kChecksumMismatch:
      return "checksum mismatch";
    case StatusCode::kUnsupported:
      return "unsupported";
    case StatusCode::kNotFound:
      return "not found";
    case StatusCode::kResourceExhausted:
      return "limit exceeded";
    case StatusCode::kCancelled:
      return "cancelled";
    case StatusCode::kInternal:
      return "internal error";
    case StatusCode::kTimeout:
      return "timed out";
    case StatusCode::kChanged:
      return "changed since opened";
  }
  return "unknown";
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  return std::string(StatusCodeName(code_)) + ": " + message_;
}

Status Status::WithContext(const std::string& context) const {
  if (ok()) return *this;
  return Status(code_, context + ": " + message_);
}

void DieWithStatus(const Status& status) {
  std::fprintf(stderr, "shardfeed: fatal: %s\n", status.ToString().c_str());
  std::abort();
}

}  // namespace shardfeed
