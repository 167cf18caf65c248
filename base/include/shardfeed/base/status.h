// Status and Result<T>: how every shardfeed library reports failure.
//
// The core never throws. A function that can fail returns Status (or Result<T> when it also
// produces a value). Messages say what failed, where (file, sample index) and why. The CLI turns
// codes into exit codes; the Python bindings turn them into exceptions.
#pragma once

#include <cstdint>
#include <optional>
#include <sstream>
#include <string>
#include <utility>

namespace shardfeed {

enum class StatusCode : int {
  kOk = 0,
  kInvalidArgument = 1,   // the caller asked for something impossible
  kIOError = 2,           // the OS or a library failed to read or write
  kCorrupt = 3,           // a container or image is structurally broken
  kChecksumMismatch = 4,  // stored data no longer matches its checksum (data loss)
  kUnsupported = 5,       // valid input we do not handle (e.g. 12-bit JPEG)
  kNotFound = 6,
  kResourceExhausted = 7,  // limits such as maximum pixels were exceeded
  kCancelled = 8,
  kInternal = 9,
  kTimeout = 10,  // a bounded wait ran out (a stuck worker, a batch that never came)
  // Data changed under a reader since it was opened (a mapped shard cut short or rewritten by
  // another process): every read of it since is suspect, and no sample-level skip helps. Reopen.
  kChanged = 11,
};

const char* StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status OK() { return Status(); }
  template <typename... Args>
  static Status InvalidArgument(Args&&... args) {
    return Make(StatusCode::kInvalidArgument, std::forward<Args>(args)...);
  }
  template <typename... Args>
  static Status IOError(Args&&... args) {
    return Make(StatusCode::kIOError, std::forward<Args>(args)...);
  }
  template <typename... Args>
  static Status Corrupt(Args&&... args) {
    return Make(StatusCode::kCorrupt, std::forward<Args>(args)...);
  }
  template <typename... Args>
  static Status ChecksumMismatch(Args&&... args) {
    return Make(StatusCode::kChecksumMismatch, std::forward<Args>(args)...);
  }
  template <typename... Args>
  static Status Unsupported(Args&&... args) {
    return Make(StatusCode::kUnsupported, std::forward<Args>(args)...);
  }
  template <typename... Args>
  static Status NotFound(Args&&... args) {
    return Make(StatusCode::kNotFound, std::forward<Args>(args)...);
  }
  template <typename... Args>
  static Status ResourceExhausted(Args&&... args) {
    return Make(StatusCode::kResourceExhausted, std::forward<Args>(args)...);
  }
  template <typename... Args>
  static Status Cancelled(Args&&... args) {
    return Make(StatusCode::kCancelled, std::forward<Args>(args)...);
  }
  template <typename... Args>
  static Status Timeout(Args&&... args) {
    return Make(StatusCode::kTimeout, std::forward<Args>(args)...);
  }
  template <typename... Args>
  static Status Changed(Args&&... args) {
    return Make(StatusCode::kChanged, std::forward<Args>(args)...);
  }
  template <typename... Args>
  static Status Internal(Args&&... args) {
    return Make(StatusCode::kInternal, std::forward<Args>(args)...);
  }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "<code name>: <message>", or "OK".
  std::string ToString() const;
  // Returns a copy whose message is "<context>: <message>"; OK stays OK.
  Status WithContext(const std::string& context) const;

 private:
  template <typename... Args>
  static Status Make(StatusCode code, Args&&... args) {
    std::ostringstream out;
    (out << ... << std::forward<Args>(args));
    return Status(code, out.str());
  }

  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

// Holds either a value or a non-OK Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}         // NOLINT: implicit by design
  Result(Status status) : status_(std::move(status)) {  // NOLINT
    if (status_.ok()) status_ = Status::Internal("Result constructed from OK status");
  }

  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }
  T& operator*() & { return *value_; }
  const T& operator*() const& { return *value_; }
  T&& operator*() && { return std::move(*value_); }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }
  T ValueOrDie() && {
    if (!ok()) Die();
    return std::move(*value_);
  }

 private:
  [[noreturn]] void Die() const;
  Status status_;
  std::optional<T> value_;
};

[[noreturn]] void DieWithStatus(const Status& status);

template <typename T>
void Result<T>::Die() const {
  DieWithStatus(status_);
}

}  // namespace shardfeed

#define SF_CONCAT_INNER(a, b) a##b
#define SF_CONCAT(a, b) SF_CONCAT_INNER(a, b)

#define SF_RETURN_IF_ERROR(expr)             \
  do {                                       \
    ::shardfeed::Status sf_status_ = (expr); \
    if (!sf_status_.ok()) return sf_status_; \
  } while (0)

#define SF_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                             \
  if (!tmp.ok()) return tmp.status();            \
  lhs = std::move(*tmp)

#define SF_ASSIGN_OR_RETURN(lhs, expr) \
  SF_ASSIGN_OR_RETURN_IMPL(SF_CONCAT(sf_result_, __LINE__), lhs, expr)
