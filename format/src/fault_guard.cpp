#include "fault_guard.h"

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <mutex>

namespace shardfeed::format::internal {
namespace {

struct Range {
  std::atomic<bool> used{false};
  std::atomic<uintptr_t> begin{0}, end{0};
  std::atomic<bool> faulted{false};
};

Range g_ranges[kMaxGuarded];
std::atomic<bool> g_any_faulted{false};
std::atomic<void (*)()> g_after_remap{nullptr};  // tests only: see SetAfterRemapHookForTest
std::mutex g_claim;  // serialises Guard/Unguard (the handler only reads)
struct sigaction g_previous;
uintptr_t g_page = 4096;

void PassOn(int sig, siginfo_t* info, void* context) {
  if (g_previous.sa_flags & SA_SIGINFO) {
    if (g_previous.sa_sigaction) g_previous.sa_sigaction(sig, info, context);
    return;
  }
  if (g_previous.sa_handler == SIG_DFL || g_previous.sa_handler == SIG_IGN) {
    // Restore the default: the faulting instruction runs again and takes the default action,
    // exactly what would have happened without us.
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    ::sigaction(sig, &dfl, nullptr);
    return;
  }
  g_previous.sa_handler(sig);
}

void OnSigbus(int sig, siginfo_t* info, void* context) {
  if (info && info->si_code > 0) {  // raised by the kernel for an access, not kill()/raise()
    const uintptr_t a = reinterpret_cast<uintptr_t>(info->si_addr);
    for (Range& r : g_ranges) {
      if (!r.used.load(std::memory_order_acquire)) continue;
      const uintptr_t b = r.begin.load(std::memory_order_relaxed);
      const uintptr_t e = r.end.load(std::memory_order_relaxed);
      if (a < b || a >= e) continue;
      // Marked before the zeros appear: another worker may read them (without a fault of its
      // own) the moment mmap returns, and its check after the read must already see the mark.
      // Marked after, that worker's check could run in between and pass its garbage on as a
      // decode error of the sample (seen under TSan in CI). If mmap fails, the signal is passed
      // on, and the mark is still true: the file did shrink under this range.
      r.faulted.store(true, std::memory_order_release);
      g_any_faulted.store(true, std::memory_order_release);
      // Everything from this page to the range's end: a truncated file lost its tail.
      const uintptr_t page = a & ~(g_page - 1);
      void* p = ::mmap(reinterpret_cast<void*>(page), e - page, PROT_READ,
                       MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p != MAP_FAILED) {
        if (auto hook = g_after_remap.load(std::memory_order_acquire)) hook();
        return;
      }
      break;
    }
  }
  PassOn(sig, info, context);
}

void Install() {
  g_page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  struct sigaction sa {};
  sa.sa_sigaction = OnSigbus;
  sa.sa_flags = SA_SIGINFO | SA_NODEFER;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGBUS, &sa, &g_previous);
}

}  // namespace

int GuardRange(const void* begin, size_t size) {
  if (!begin || size == 0) return -1;
  static std::once_flag once;
  std::call_once(once, Install);
  std::lock_guard<std::mutex> lock(g_claim);
  for (int i = 0; i < kMaxGuarded; ++i) {
    Range& r = g_ranges[i];
    if (r.used.load(std::memory_order_relaxed)) continue;
    const uintptr_t b = reinterpret_cast<uintptr_t>(begin) & ~(g_page - 1);
    const uintptr_t e = (reinterpret_cast<uintptr_t>(begin) + size + g_page - 1) & ~(g_page - 1);
    r.begin.store(b, std::memory_order_relaxed);
    r.end.store(e, std::memory_order_relaxed);
    r.faulted.store(false, std::memory_order_relaxed);
    r.used.store(true, std::memory_order_release);
    return i;
  }
  return -1;
}

void UnguardRange(int id) {
  if (id < 0 || id >= kMaxGuarded) return;
  std::lock_guard<std::mutex> lock(g_claim);
  g_ranges[id].used.store(false, std::memory_order_release);
}

void SetAfterRemapHookForTest(void (*hook)()) {
  g_after_remap.store(hook, std::memory_order_release);
}

bool AnyFaulted() { return g_any_faulted.load(std::memory_order_acquire); }

bool RangeFaulted(int id) {
  return id >= 0 && id < kMaxGuarded && g_ranges[id].faulted.load(std::memory_order_acquire);
}

}  // namespace shardfeed::format::internal
