// Data safety at the library level (docs/DESIGN.md, "Data safety"): limits applied at read time
// to records that pass every checksum, and the writer's lock inside one process. The commands'
// side is in tests/cli/test_data_safety.py.
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>

#include "../../format/src/fault_guard.h"
#include "shardfeed/format/archive.h"
#include "shardfeed/reader/transform.h"
#include "shardfeed/validate/verify.h"
#include "test_util.h"

namespace shardfeed {
namespace {

using testing::TempDir;

// A zstd frame that declares `content` bytes and holds one empty raw block: 14 bytes that would
// make a careless reader allocate `content` bytes before finding out.
std::vector<uint8_t> FrameDeclaring(uint64_t content) {
  std::vector<uint8_t> f = {0x28, 0xB5, 0x2F, 0xFD, 0xE0};  // magic; single segment, 8-byte size
  for (int i = 0; i < 8; ++i) f.push_back(static_cast<uint8_t>(content >> (8 * i)));
  f.insert(f.end(), {0x01, 0x00, 0x00});  // last block, raw, 0 bytes
  return f;
}

TEST_CASE("a record declaring 20000x20000 pixels is refused at read, never allocated") {
  TempDir dir;
  format::WriterOptions wo;
  wo.encoding = format::Encoding::kZstd;
  auto w = format::ArchiveWriter::Create(dir / "a", wo);
  REQUIRE(w.ok());
  format::IndexEntry e{};
  e.height = e.width = 20000;
  e.channels = 3;
  e.encoding = static_cast<uint8_t>(format::Encoding::kZstd);
  e.orientation = 1;
  auto frame = FrameDeclaring(uint64_t{20000} * 20000 * 3);
  REQUIRE((*w)->Append(e, frame.data(), frame.size()).ok());
  format::Manifest m;
  m.encoding = format::Encoding::kZstd;
  m.class_names = {"x"};
  REQUIRE((*w)->Finish(m).ok());
  auto archive = format::Archive::Open(dir / "a");
  REQUIRE(archive.ok());  // checksums are all valid: only the declared size is hostile
  CHECK((*archive)->VerifyRecord(0).ok());

  reader::TransformOptions t;
  t.size = 32;
  reader::SampleDecoder decoder(*archive, t);
  std::vector<uint8_t> out(decoder.sample_bytes());
  reader::StageTimes times;
  Status s = decoder.DecodeInto(0, 0, out.data(), &times);
  CHECK(s.code() == StatusCode::kResourceExhausted);
  CHECK(s.message().find("sample 0") != std::string::npos);
  CHECK(s.message().find("max_pixels") != std::string::npos);

  validate::VerifyOptions vo;
  vo.decode = true;
  auto report = validate::Verify(**archive, vo);
  REQUIRE(report.bad_samples.size() == 1);
  CHECK(report.bad_samples[0].reason.find("above the limit") != std::string::npos);
}

TEST_CASE("a record without pixels is refused by the writer") {
  TempDir dir;
  format::WriterOptions wo;
  wo.encoding = format::Encoding::kRaw;
  auto w = format::ArchiveWriter::Create(dir / "a", wo);
  REQUIRE(w.ok());
  format::IndexEntry e{};
  e.channels = 3;
  e.encoding = static_cast<uint8_t>(format::Encoding::kRaw);
  e.orientation = 1;
  CHECK((*w)->Append(e, nullptr, 0).code() == StatusCode::kInvalidArgument);
}

TEST_CASE("a second writer of the same path fails and leaves the first one's work alone") {
  TempDir dir;
  auto first = format::ArchiveWriter::Create(dir / "a", {});
  REQUIRE(first.ok());
  format::IndexEntry e{};
  e.height = e.width = 1;
  e.channels = 3;
  e.encoding = static_cast<uint8_t>(format::Encoding::kJpeg);
  e.orientation = 1;
  const uint8_t payload[4] = {1, 2, 3, 4};
  REQUIRE((*first)->Append(e, payload, sizeof(payload)).ok());
  {
    auto second = format::ArchiveWriter::Create(dir / "a", {});
    REQUIRE(!second.ok());
    CHECK(second.status().message().find("locked") != std::string::npos);
  }  // (before: its destructor removed a.partial and a.lock)
  format::Manifest m;
  m.class_names = {"x"};
  REQUIRE((*first)->Finish(m).ok());
  auto archive = format::Archive::Open(dir / "a");
  REQUIRE(archive.ok());
  CHECK((*archive)->size() == 1);
}

TEST_CASE("a record of another encoding than the archive's is refused by the writer") {
  TempDir dir;
  format::WriterOptions wo;
  wo.encoding = format::Encoding::kZstd;
  auto w = format::ArchiveWriter::Create(dir / "a", wo);
  REQUIRE(w.ok());
  format::IndexEntry e{};
  e.height = e.width = 1;
  e.channels = 3;
  e.encoding = static_cast<uint8_t>(format::Encoding::kJpeg);
  e.orientation = 1;
  const uint8_t payload[4] = {1, 2, 3, 4};
  Status s = (*w)->Append(e, payload, sizeof(payload));
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK(s.message().find("encoding jpeg") != std::string::npos);
  CHECK((*w)->samples_written() == 0);
  e.encoding = 9;
  CHECK((*w)->Append(e, payload, sizeof(payload)).code() == StatusCode::kInvalidArgument);
}

// Writes a small LMDB archive: its index is a few entries, stored inside a B-tree leaf at an
// offset that is not 8-byte aligned, so the reader keeps a heap copy of it.
std::string SmallLmdbArchive(const TempDir& dir) {
  auto w = format::ArchiveWriter::Create(dir / "small", {});
  REQUIRE(w.ok());
  format::IndexEntry e{};
  e.height = e.width = 1;
  e.channels = 3;
  e.encoding = static_cast<uint8_t>(format::Encoding::kJpeg);
  e.orientation = 1;
  const uint8_t payload[4] = {1, 2, 3, 4};
  for (int i = 0; i < 3; ++i) REQUIRE((*w)->Append(e, payload, sizeof(payload)).ok());
  format::Manifest m;
  m.class_names = {"x"};
  REQUIRE((*w)->Finish(m).ok());
  return dir / "small";
}

// Set by the hook below, inside the SIGBUS handler, the moment the zero pages are mapped.
std::atomic<int> g_marked_when_remapped{-1};
int g_hook_range = -1;
void RecordMarkAtRemap() {
  g_marked_when_remapped.store(
      format::internal::AnyFaulted() && format::internal::RangeFaulted(g_hook_range),
      std::memory_order_relaxed);
}

TEST_CASE("the SIGBUS guard marks a range faulted before another thread can read its zeros") {
  // Before: the handler mapped the zero pages first and marked the range after, so a second
  // worker reading those pages in between (no fault of its own) checked the mark, found none,
  // and reported its garbage as a decode error of the sample instead of the shard's truncation
  // (reader_tsan in CI, "a shard truncated on disk while mapped").
  TempDir dir;
  const std::string file = dir / "shard";
  const long page = ::sysconf(_SC_PAGESIZE);
  int fd = ::open(file.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0644);
  REQUIRE(fd >= 0);
  REQUIRE(::ftruncate(fd, 4 * page) == 0);
  auto* map =
      static_cast<volatile uint8_t*>(::mmap(nullptr, 4 * page, PROT_READ, MAP_SHARED, fd, 0));
  REQUIRE(map != MAP_FAILED);
  ::close(fd);
  g_hook_range = format::internal::GuardRange(const_cast<uint8_t*>(map), 4 * page);
  REQUIRE(g_hook_range >= 0);
  format::internal::SetAfterRemapHookForTest(RecordMarkAtRemap);
  REQUIRE(::truncate(file.c_str(), page) == 0);
  const uint8_t lost = map[2 * page];  // past the new end: SIGBUS, answered with a zero page
  format::internal::SetAfterRemapHookForTest(nullptr);
  format::internal::UnguardRange(g_hook_range);
  ::munmap(const_cast<uint8_t*>(map), 4 * page);
  CHECK(lost == 0);
  CHECK(g_marked_when_remapped.load() == 1);
}

TEST_CASE("the SIGBUS guard leaves a fault outside the archive's mappings alone") {
  // Before: the guarded range of an LMDB shard whose index was copied to the heap ran from the
  // heap to the map, so a SIGBUS in any mapping in between (here a file of the user's that
  // shrank) was answered by mapping zeros over everything up to the shard's map.
  TempDir dir;
  auto archive = format::Archive::Open(SmallLmdbArchive(dir), format::IndexCheck::kFull);
  REQUIRE(archive.ok());
  REQUIRE((*archive)->At(0).ok());
  const std::string other = dir / "users-file";
  const long page = ::sysconf(_SC_PAGESIZE);
  int fd = ::open(other.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0644);
  REQUIRE(fd >= 0);
  REQUIRE(::ftruncate(fd, 4 * page) == 0);
  auto* map =
      static_cast<volatile uint8_t*>(::mmap(nullptr, 4 * page, PROT_READ, MAP_SHARED, fd, 0));
  REQUIRE(map != MAP_FAILED);
  REQUIRE(::ftruncate(fd, 0) == 0);
  ::close(fd);
  pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    uint8_t sum = map[2 * page];  // past the file's end: the kernel raises SIGBUS
    ::_exit(sum == 0 ? 3 : 4);    // reached only if something answered it with a page
  }
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  ::munmap(const_cast<uint8_t*>(map), 4 * page);
  INFO("exit status " << status);
  // The fault goes on to the handler before the guard's: none (the child dies of SIGBUS) or,
  // in a sanitizer build, the sanitizer's, which reports it and exits (ASan 1, TSan 66). Never
  // a page.
  CHECK(!(WIFEXITED(status) && (WEXITSTATUS(status) == 3 || WEXITSTATUS(status) == 4)));
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
  CHECK(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == SIGBUS);
#endif
}

}  // namespace
}  // namespace shardfeed
