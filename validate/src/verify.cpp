#include "shardfeed/validate/verify.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "fields_io.h"
#include "shardfeed/base/cpus.h"
#include "shardfeed/codec/codec.h"

namespace shardfeed::validate {

const OptionTable<VerifyOptions>& VerifyOptionTable() {
  using VO = VerifyOptions;
  static const OptionTable<VO> table(
      "verify option",
      {CountOption<VO>("workers", 0, 4096, "threads (0: all cores)", &VO::workers),
       CountOption<VO>("max_pixels", 1, UINT64_MAX,
                       "with --decode: refuse records declaring more pixels than this",
                       &VO::max_pixels)});
  return table;
}
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// Decodes a record the way a reader would and checks it against its index entry.
Status CheckDecodes(const format::RecordView& r, codec::Context& ctx, uint64_t max_pixels) {
  SF_RETURN_IF_ERROR(format::CheckPixelLimit(*r.entry, max_pixels));
  SF_ASSIGN_OR_RETURN(const codec::Codec* c, codec::CodecFor(*r.entry));
  imaging::Limits limits;
  limits.max_pixels = max_pixels;
  return c->Check(ctx, r, limits);
}

// "sample N: reason" once: format/ and codec/ messages may already name the sample (and the
// archive, which the report names once).
std::string SampleReason(const format::Archive& archive, uint64_t i, const Status& st) {
  std::string m = st.message();
  const std::string archive_prefix = archive.path() + ": ";
  if (m.compare(0, archive_prefix.size(), archive_prefix) == 0) m.erase(0, archive_prefix.size());
  const std::string sample = "sample " + std::to_string(i);
  if (m.compare(0, sample.size(), sample) != 0) m = sample + ": " + m;
  return m;
}

// Whether `path` has a manifest (a folder's file, or a remote location's object; a remote
// one must be ours): an archive that failed to open with one is damaged (a shard missing), not
// a wrong path.
bool ManifestThere(const std::string& path, const storage::CacheOptions& cache) {
  const std::string name(format::kManifestFileName);
  if (storage::IsRemote(path)) {
    auto remote = storage::Remote::Open(path, cache);
    if (!remote.ok()) return false;
    auto text = (*remote)->ReadText(name, format::kMaxManifestBytes);
    return text.ok() && format::IsShardfeedManifest(*text);
  }
  std::error_code ec;
  return fs::exists(fs::path(path) / name, ec);
}

}  // namespace

std::string VerifyReport::ToJson() const {
  json bad = json::array();
  for (const auto& b : bad_samples) bad.push_back({{"index", b.index}, {"reason", b.reason}});
  json j = {{"archive", archive},           {"ok", ok()},          {"samples", samples},
            {"checked", checked},           {"bad_samples", bad},  {"bad_shards", bad_shards},
            {"bad_manifest", bad_manifest}, {"repaired", repaired}};
  if (!error.empty()) j["error"] = error;
  return j.dump(2, ' ', false, json::error_handler_t::replace) + "\n";
}

std::string VerifyReport::ToText(const std::string& path, bool decoded) const {
  std::string out;
  for (const auto& s : repaired) out += "REPAIRED cache: " + s + "\n";
  for (const auto& s : bad_manifest) out += "BAD manifest: " + s + "\n";
  for (const auto& s : bad_shards) {
    if (error.find(s) == std::string::npos) out += "BAD shard: " + s + "\n";
  }
  for (const auto& b : bad_samples) out += "BAD " + b.reason + "\n";  // the reason names it
  out += path + ": " + std::to_string(checked) + " samples checked" +
         (decoded ? " and decoded" : "") + ", " + std::to_string(bad_samples.size()) +
         " bad samples, " + std::to_string(bad_shards.size()) + " bad shards" +
         (bad_manifest.empty() ? "" : ", manifest disagrees") + ": " + (ok() ? "OK" : "FAILED") +
         "\n";
  return out;
}

VerifyReport Verify(const format::Archive& archive, const VerifyOptions& options,
                    const std::function<void(uint64_t, uint64_t)>& progress) {
  VerifyReport report;
  report.archive = archive.path();
  report.samples = archive.size();
  archive.Advise(format::Archive::Access::kSequential);
  const auto& shards = archive.manifest().shards;
  // Shards that do not open (a lazily opened archive whose full open failed): reported once
  // here, their samples not checked one by one (each would say the same).
  std::vector<char> unopened(shards.size(), 0);
  for (size_t s = 0; s < shards.size() && !Cancelled(options.cancel); ++s) {
    Status st = archive.VerifyShard(s);
    if (!st.ok()) report.bad_shards.push_back(st.message());
    // A shard whose hash does not match but that is open (mapped: a local file) has its
    // samples checked one by one, to name the damaged records; one that did not open (a remote
    // shard whose download does not match its manifest entry) is named once.
    unopened[s] =
        !st.ok() && (st.code() != StatusCode::kChecksumMismatch || !archive.ShardOpen(s));
  }
  // Derived manifest fields (payload bytes, file bytes, chunk bytes, class counts) against
  // the shards they describe (format/'s cross-check): every shard must open for it.
  const bool all_open = std::find(unopened.begin(), unopened.end(), 1) == unopened.end();
  if (all_open) {
    if (Status d = archive.VerifyDerived(); !d.ok()) report.bad_manifest.push_back(d.message());
  }
  const uint64_t n = archive.size();
  const uint64_t block = 256;
  std::atomic<uint64_t> next{0}, done{0}, skipped{0};
  std::mutex mu;
  auto work = [&]() {
    codec::Context ctx;
    std::vector<BadSample> bad;
    for (;;) {
      const uint64_t begin = Cancelled(options.cancel) ? n : next.fetch_add(block);
      if (begin >= n) break;
      const uint64_t end = std::min(n, begin + block);
      for (uint64_t i = begin; i < end; ++i) {
        if (!all_open && unopened[archive.ShardOf(i)]) {
          skipped.fetch_add(1, std::memory_order_relaxed);
          continue;
        }
        Status st = archive.VerifyRecord(i);
        if (st.ok() && options.decode) {
          auto r = archive.At(i);
          st = r.ok() ? CheckDecodes(*r, ctx, options.max_pixels) : r.status();
          // Version 4: masks decompressed, arrays against the schema, JSON parsed.
          if (st.ok()) st = CheckSampleFields(archive, i, options.max_pixels);
        }
        if (!st.ok()) bad.push_back({i, SampleReason(archive, i, st)});
      }
      done += end - begin;
    }
    std::lock_guard<std::mutex> lock(mu);
    report.bad_samples.insert(report.bad_samples.end(), bad.begin(), bad.end());
  };
  std::vector<std::thread> threads;
  const int workers = options.workers > 0 ? options.workers : AvailableCpus();
  for (int t = 0; t < workers; ++t) threads.emplace_back(work);
  if (progress) {
    // Polls for the display only; the joins below are what waits for the work.
    while (done.load() < n && !Cancelled(options.cancel)) {
      progress(done.load(), n);
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  for (auto& t : threads) t.join();
  report.checked = done.load() - skipped.load();
  if (progress) progress(report.checked, n);
  std::sort(report.bad_samples.begin(), report.bad_samples.end(),
            [](const BadSample& a, const BadSample& b) { return a.index < b.index; });
  return report;
}

Result<VerifyReport> VerifyPath(const std::string& path, const VerifyOptions& options,
                                const std::function<void(uint64_t, uint64_t)>& progress) {
  std::vector<std::string> repaired;
  for (int pass = 0;; ++pass) {
    format::OpenOptions open;
    open.check = format::IndexCheck::kFull;
    open.cache = options.cache;
    open.cancel = options.cancel;
    auto archive = format::Archive::Open(path, open);
    if (!archive.ok()) {
      // Not there, or not an archive at all: the caller asked for the wrong thing.
      const StatusCode code = archive.status().code();
      if (code == StatusCode::kCancelled) return archive.status();
      if ((code == StatusCode::kNotFound || code == StatusCode::kInvalidArgument) &&
          !ManifestThere(path, options.cache)) {
        return archive.status();
      }
      // A remote archive that could not be read says nothing about the archive: the network,
      // the store down, a cache full or unusable. (A local shard file that is missing or
      // unreadable is the archive's damage: a report.)
      if (storage::IsRemote(path) &&
          (code == StatusCode::kIOError || code == StatusCode::kTimeout ||
           code == StatusCode::kResourceExhausted)) {
        return archive.status();
      }
      // Damage that stops a full open (a shard's index, a shard missing): opened lazily, so
      // the report names every bad shard, not only the first the open met.
      format::OpenOptions lazy = open;
      lazy.check = format::IndexCheck::kLazy;
      auto partial = format::Archive::Open(path, lazy);
      VerifyReport report;
      if (partial.ok()) report = Verify(**partial, options, progress);
      if (Cancelled(options.cancel)) return Status::Cancelled(path, ": verify cancelled");
      report.archive = path;
      // The damage the full open met is `error`; the lazy pass names every bad shard, that one
      // included (a summary counting shards then counts it).
      report.error = archive.status().ToString();
      report.repaired = repaired;
      return report;
    }
    // Copies that no longer opened were replaced while opening (kFull opens every shard);
    // those a check found changed since their download are removed by it, and one more pass
    // reads them as downloaded again.
    const size_t at_open = (*archive)->DiscardNotes().size();
    VerifyReport report = Verify(**archive, options, progress);
    if (Cancelled(options.cancel)) return Status::Cancelled(path, ": verify cancelled");
    const std::vector<std::string> notes = (*archive)->DiscardNotes();
    repaired.insert(repaired.end(), notes.begin(), notes.end());
    if (notes.size() == at_open || pass >= 1) {
      report.repaired = repaired;
      return report;
    }
  }
}

}  // namespace shardfeed::validate
