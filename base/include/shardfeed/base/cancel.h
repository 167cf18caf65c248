// CancelToken: how a caller stops a long blocking operation (a remote archive's downloads, an
// upload) from another thread or from a signal handler. The one cancel mechanism of shardfeed:
// every operation that can be cancelled takes a `const CancelToken*` and honours it as below.
//
// Ownership. The caller owns the token and keeps it alive until every operation it was given to
// has returned; an operation reads it only while it runs and never keeps it (null: the operation
// cannot be cancelled). One token may be given to several operations, on several threads.
//
// Effect. Cancel() is sticky (a token is never reset: make a new one). An operation given the
// token stops at its next check: a transfer in flight is abandoned at libcurl's next progress
// callback (within about a second, even while the server sends nothing), a retry's back-off or a
// wait for another process's lock ends, and no further step is begun. What it leaves behind is
// said by the operation (a download's partial file is removed, never renamed into the cache), and
// it returns StatusCode::kCancelled (Status::Cancelled) naming what it was doing, unless it had
// already finished or failed for another reason.
#pragma once

#include <atomic>

namespace shardfeed {

class CancelToken {
 public:
  CancelToken() = default;
  CancelToken(const CancelToken&) = delete;
  CancelToken& operator=(const CancelToken&) = delete;

  // Asks every operation given this token to stop. Thread-safe and async-signal-safe (one
  // lock-free atomic store): a SIGINT handler may call it.
  void Cancel() noexcept { cancelled_.store(true, std::memory_order_relaxed); }
  bool cancelled() const noexcept { return cancelled_.load(std::memory_order_relaxed); }

 private:
  static_assert(std::atomic<bool>::is_always_lock_free, "Cancel() must be async-signal-safe");
  std::atomic<bool> cancelled_{false};
};

// True when `cancel` (may be null: never) has been cancelled.
inline bool Cancelled(const CancelToken* cancel) { return cancel && cancel->cancelled(); }

// Sleeps `seconds`, waking at least every 50 ms to check `cancel` (may be null: a plain sleep).
// Returns false, early, once it is cancelled; true after the whole sleep.
bool SleepUnlessCancelled(double seconds, const CancelToken* cancel);

}  // namespace shardfeed
