// One rank of a large job opening an archive: resident memory and time until its first batch,
// with the index fully checked at open (IndexCheck::kFull) and lazily (kLazy), for archives of
// growing size. Each measurement runs in a fresh child process (RSS from /proc/self/status,
// page cache dropped of nothing: the archive was just written, so its pages are warm: this
// measures our work, not the disk).
//   open_scale DIR [N ...]     (default N: 250000 1000000 2000000)
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "shardfeed/format/archive.h"
#include "shardfeed/reader/loader.h"

using namespace shardfeed;
using Clock = std::chrono::steady_clock;

namespace {

// Resident KiB: private (anonymous: what this rank alone pays) and file-backed (mapped pages of
// the archive: page cache, shared by every process on the node that maps the same files).
struct Rss {
  long anon = 0, file = 0;
};
Rss ReadRss() {
  Rss r;
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("RssAnon:", 0) == 0) r.anon = std::atol(line.c_str() + 8);
    if (line.rfind("RssFile:", 0) == 0) r.file = std::atol(line.c_str() + 8);
  }
  return r;
}

// n raw 4x4 records (48 bytes) in shards of 4 MiB, 10 classes.
bool Write(const std::string& path, uint64_t n) {
  format::WriterOptions wo;
  wo.encoding = format::Encoding::kRaw;
  wo.height = wo.width = 4;
  wo.shard_bytes = 4 << 20;
  wo.overwrite = true;
  auto w = format::ArchiveWriter::Create(path, wo);
  if (!w.ok()) return false;
  std::vector<uint8_t> px(48);
  for (uint64_t i = 0; i < n; ++i) {
    px[0] = static_cast<uint8_t>(i);
    format::IndexEntry e{};
    e.label = static_cast<int32_t>(i % 10);
    e.height = e.width = 4;
    e.channels = 3;
    e.encoding = static_cast<uint8_t>(format::Encoding::kRaw);
    e.orientation = 1;
    if (!(*w)->Append(e, px.data(), px.size()).ok()) return false;
  }
  format::Manifest m;
  m.encoding = format::Encoding::kRaw;
  m.height = m.width = 4;
  m.channels = 3;
  for (int c = 0; c < 10; ++c) m.class_names.push_back("c" + std::to_string(c));
  return (*w)->Finish(m).ok();
}

void Measure(const std::string& path, format::IndexCheck check, const char* name, uint64_t n) {
  std::fflush(stdout);
  pid_t pid = fork();
  if (pid != 0) {
    waitpid(pid, nullptr, 0);
    return;
  }
  const Rss before = ReadRss();
  auto t = Clock::now();
  auto archive = format::Archive::Open(path, check);
  if (!archive.ok()) std::_Exit(1);
  const double open_s = std::chrono::duration<double>(Clock::now() - t).count();
  const Rss at_open = ReadRss();
  reader::LoaderOptions o;
  o.batch_size = 256;
  o.shuffle = true;
  o.world_size = 1000;
  o.rank = 17;
  o.workers = 1;
  o.prefetch = 2;
  o.transform.crop = reader::Crop::kNone;
  o.transform.size = 0;
  auto loader = reader::Loader::Create(*archive, o);
  if (!loader.ok() || !(*loader)->StartEpoch(0).ok()) std::_Exit(1);
  auto batch = (*loader)->Next();
  if (!batch.ok()) std::_Exit(1);
  const double first_s = std::chrono::duration<double>(Clock::now() - t).count();
  const Rss at_first = ReadRss();
  auto mb = [](long kb) { return kb / 1024.0; };
  std::printf("%-10llu %-5s %8.1f ms %9.1f ms %9.1f / %5.1f MB %9.1f / %5.1f MB %5zu of %zu\n",
              static_cast<unsigned long long>(n), name, open_s * 1e3, first_s * 1e3,
              mb(at_open.anon - before.anon), mb(at_open.file - before.file),
              mb(at_first.anon - before.anon), mb(at_first.file - before.file),
              (*archive)->OpenedShards(), (*archive)->manifest().shards.size());
  std::fflush(stdout);
  std::_Exit(0);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: open_scale DIR [N ...]\n");
    return 2;
  }
  std::vector<uint64_t> sizes;
  for (int i = 2; i < argc; ++i) sizes.push_back(std::strtoull(argv[i], nullptr, 10));
  if (sizes.empty()) sizes = {250000, 1000000, 2000000};
  std::printf("%-10s %-5s %11s %12s %20s %20s %10s\n", "samples", "check", "open", "1st batch",
              "at open: priv/file", "at 1st: priv/file", "shards");
  for (uint64_t n : sizes) {
    const std::string path = std::string(argv[1]) + "/open-scale-" + std::to_string(n);
    if (!Write(path, n)) {
      std::fprintf(stderr, "cannot write %s\n", path.c_str());
      return 1;
    }
    Measure(path, format::IndexCheck::kFull, "full", n);
    Measure(path, format::IndexCheck::kLazy, "lazy", n);
    std::error_code ec;
    if (!std::getenv("OPEN_SCALE_KEEP")) std::filesystem::remove_all(path, ec);
  }
  return 0;
}
