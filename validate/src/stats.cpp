// The stats pass (validate/stats.h): one decoding pass with every measure, the near-duplicate
// search, and the report (JSON, fail-on).
// long file: the pass and its report share the per-sample records; split, each would need them.
#include "shardfeed/validate/stats.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <limits>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <numeric>
#include <set>
#include <sstream>
#include <thread>
#include <unordered_map>

#include "fields_io.h"
#include "pixel_measures.h"
#include "sample_context.h"
#include "shardfeed/base/cpus.h"
#include "shardfeed/base/option_text.h"
#include "shardfeed/codec/codec.h"
#include "shardfeed/format/stats_record.h"
#include "shardfeed/storage/remote.h"

namespace shardfeed::validate {
namespace {

using nlohmann::json;

enum ColorBits : uint8_t { kGrayJpeg = 1, kGrayPixels = 2, kCmyk = 4, kRotated = 8 };

// What the pass keeps of each sample (64 bytes: 10^6 samples take 64 MB).
struct SampleStat {
  // hash: what exact duplicates share. PixelHash of the decoded pixels where another sample (of
  // any archive of the call) has the same key, else the key itself (ConfirmExactDuplicates).
  uint64_t key = 0, hash = 0;
  uint64_t phash = 0;  // perceptual hash
  uint32_t width = 0, height = 0;
  uint64_t bytes = 0;
  int32_t label = -1;
  float luma_mean = 0, luma_std = 0, laplacian = 0;
  uint8_t color = 0;
  bool ok = false;
};

// One sample: decoded upright as a reader sees it, measured, hashed.
Status MeasureSample(const format::Archive& archive, uint64_t i, const StatsOptions& o,
                     codec::Context& ctx, imaging::Image& img, imaging::Image& scratch,
                     PixelScratch* pixels, PixelSums* sums, SampleStat* s) {
  // The record's checksum first, as the loader does by default: a damaged record's pixels
  // were averaged (and saved with --save) without a word.
  SF_RETURN_IF_ERROR(archive.VerifyRecord(i, /*fields=*/true));  // its field values' too
  SF_ASSIGN_OR_RETURN(const format::RecordView r, archive.At(i));
  const format::IndexEntry& e = *r.entry;
  s->label = e.label;
  s->bytes = r.size;
  if (e.orientation > 1) s->color |= kRotated;
  if (e.encoding == uint8_t(format::Encoding::kJpeg)) {
    imaging::Limits limits;
    limits.max_pixels = o.max_pixels;
    auto info = imaging::ProbeJpeg(r.data, r.size, false, limits);
    if (info.ok() && info->components == 1) s->color |= kGrayJpeg;
    if (info.ok() && info->components == 4) s->color |= kCmyk;
  }
  SF_RETURN_IF_ERROR(format::CheckPixelLimit(e, o.max_pixels));
  SF_ASSIGN_OR_RETURN(const codec::Codec* c, codec::CodecFor(e));
  imaging::Limits limits;
  limits.max_pixels = o.max_pixels;
  // Strictly: an image the decoder had to guess at (a truncated scan) is a broken image, listed
  // in `errors`, not a sample to average.
  SF_RETURN_IF_ERROR(c->Decode(ctx, r, limits, /*strict=*/true, &img));
  SF_RETURN_IF_ERROR(archive.CheckUnchanged(i));
  s->width = img.width;
  s->height = img.height;
  const PixelMeasures p = MeasurePixels(img.pixels.data(), img.width, img.height, pixels);
  if (o.size == 0) sums->Merge(p.sums);
  s->key = s->hash = p.key;
  const LumaMeasures& l = p.luma;
  s->phash = l.phash;
  s->luma_mean = l.mean, s->luma_std = l.std, s->laplacian = l.laplacian;
  if (l.gray) s->color |= kGrayPixels;
  if (o.size != 0) {
    // The loader's evaluation transform (crop="center"): the centre square of 224/256 of the
    // short side, resized to size x size.
    const uint32_t short_side = std::min(img.width, img.height);
    const uint32_t crop = std::max<uint32_t>(1, uint32_t(short_side * (224.0 / 256.0)));
    const uint32_t x0 = (img.width - crop) / 2, y0 = (img.height - crop) / 2;
    scratch.Resize(o.size, o.size, 3);
    imaging::ResizeInto(img.pixels.data() + (size_t{y0} * img.width + x0) * 3, crop, crop,
                        size_t{img.width} * 3, 3, scratch.pixels.data(), o.size, o.size);
    sums->Add(scratch.pixels.data(), size_t{o.size} * o.size);
  }
  s->ok = true;
  return Status::OK();
}

struct Measured {
  std::vector<SampleStat> samples;
  PixelSums sums;
  std::vector<std::pair<uint64_t, std::string>> errors;
  // A shard changed on disk while the pass read it (kChanged): not one broken image but a pass
  // none of whose figures can be trusted; the call fails with it.
  Status changed;
};

// The decoding pass over one archive: blocks of samples claimed by `workers` threads, each
// with its own decoder context and sums, merged at the end. `done` counts samples finished.
Measured MeasureArchive(const format::Archive& archive, const StatsOptions& o,
                        const StatsProgress& progress, uint64_t done_before, uint64_t total) {
  std::atomic<uint64_t> done_here{0};
  std::atomic<uint64_t>* done = &done_here;
  Measured m;
  const uint64_t n = archive.size();
  m.samples.resize(n);
  archive.Advise(format::Archive::Access::kSequential);
  std::atomic<uint64_t> next{0};
  std::mutex mu;
  auto work = [&]() {
    codec::Context ctx;
    imaging::Image img, scratch;
    PixelScratch pixels;
    PixelSums sums;
    std::vector<std::pair<uint64_t, std::string>> errors;
    // Small claims: the workers finish within a few samples of each other.
    const uint64_t block = 8;
    for (;;) {
      const uint64_t begin = Cancelled(o.cancel) ? n : next.fetch_add(block);
      if (begin >= n) break;
      const uint64_t end = std::min(n, begin + block);
      for (uint64_t i = begin; i < end; ++i) {
        SampleStat& s = m.samples[i];
        Status st = MeasureSample(archive, i, o, ctx, img, scratch, &pixels, &sums, &s);
        if (!st.ok()) {
          s.ok = false;
          errors.emplace_back(i, ForSample(archive.path(), i, st).message());
          if (st.code() == StatusCode::kChanged) {
            std::lock_guard<std::mutex> lock(mu);
            if (m.changed.ok()) m.changed = ForSample(archive.path(), i, st);
          }
        }
      }
      *done += end - begin;
    }
    std::lock_guard<std::mutex> lock(mu);
    m.sums.Merge(sums);
    m.errors.insert(m.errors.end(), errors.begin(), errors.end());
  };
  std::vector<std::thread> threads;
  const int workers = o.workers > 0 ? o.workers : AvailableCpus();
  for (int t = 0; t < workers; ++t) threads.emplace_back(work);
  if (progress) {
    // Polls for the display only; the joins below are what waits for the work.
    while (done->load() < n && !Cancelled(o.cancel)) {
      progress(done_before + done->load(), total);
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  for (auto& t : threads) t.join();
  std::sort(m.errors.begin(), m.errors.end());
  return m;
}

// The samples of every archive of the call whose key another sample shares (each such set
// holds every group of equal images, and rarely images that only share sizes, sums and
// perceptual hash) are decoded again and their `hash` set to PixelHash of their pixels, so
// that equal hashes mean equal pixels as if every image had been hashed in the pass. Usually
// none or a few; at worst (every image a duplicate) a second decode of each.
Status ConfirmExactDuplicates(
    const std::vector<std::pair<const format::Archive*, std::vector<SampleStat>*>>& sets,
    const StatsOptions& o) {
  std::unordered_map<uint64_t, uint32_t> count;
  for (const auto& [archive, samples] : sets) {
    for (const SampleStat& s : *samples) {
      if (s.ok) ++count[s.key];
    }
  }
  std::vector<std::pair<size_t, uint64_t>> jobs;  // (set, sample)
  for (size_t k = 0; k < sets.size(); ++k) {
    const std::vector<SampleStat>& samples = *sets[k].second;
    for (uint64_t i = 0; i < samples.size(); ++i) {
      if (samples[i].ok && count[samples[i].key] > 1) jobs.emplace_back(k, i);
    }
  }
  if (jobs.empty()) return Status::OK();
  std::atomic<size_t> next{0};
  std::mutex mu;
  Status first_error;
  auto work = [&]() {
    codec::Context ctx;
    imaging::Image img;
    imaging::Limits limits;
    limits.max_pixels = o.max_pixels;
    for (size_t j; (j = next.fetch_add(1)) < jobs.size();) {
      const format::Archive& archive = *sets[jobs[j].first].first;
      const uint64_t i = jobs[j].second;
      SampleStat& s = (*sets[jobs[j].first].second)[i];
      Status st = [&]() -> Status {
        SF_ASSIGN_OR_RETURN(const format::RecordView r, archive.At(i));
        SF_ASSIGN_OR_RETURN(const codec::Codec* c, codec::CodecFor(*r.entry));
        SF_RETURN_IF_ERROR(c->Decode(ctx, r, limits, /*strict=*/true, &img));
        SF_RETURN_IF_ERROR(archive.CheckUnchanged(i));
        if (img.width != s.width || img.height != s.height) {
          return Status::Corrupt("decoded ", img.width, "x", img.height, " this time, ", s.width,
                                 "x", s.height, " before");
        }
        s.hash = PixelHash(img.pixels.data(), img.width, img.height);
        return Status::OK();
      }();
      if (!st.ok()) {
        std::lock_guard<std::mutex> lock(mu);
        if (first_error.ok()) first_error = ForSample(archive.path(), i, st);
      }
    }
  };
  std::vector<std::thread> threads;
  const int workers = o.workers > 0 ? o.workers : AvailableCpus();
  for (int t = 0; t < std::min<int>(workers, int(std::min<size_t>(jobs.size(), 4096))); ++t) {
    threads.emplace_back(work);
  }
  for (auto& t : threads) t.join();
  return first_error;
}

}  // namespace

const OptionTable<StatsOptions>& StatsOptionTable() {
  using SO = StatsOptions;
  static const OptionTable<SO> table(
      "stats option",
      {CountOption<SO>("size", 0, 4096,
                       "mean/std after the loader's centre crop resized to SIZE x SIZE (0: stored "
                       "images)",
                       &SO::size),
       CountOption<SO>("workers", 0, 4096, "threads (0: all cores)", &SO::workers),
       CountOption<SO>("near_threshold", 0, 16,
                       "near duplicates: perceptual hashes at most this many bits apart",
                       &SO::near_threshold),
       NumberOption<SO>("dark", {0, 255}, "flag: mean luma below", &SO::dark),
       NumberOption<SO>("bright", {0, 255}, "flag: mean luma above", &SO::bright),
       NumberOption<SO>("uniform", {0, 255}, "flag: luma standard deviation below", &SO::uniform),
       NumberOption<SO>("blurry", {0, 1e9},
                        "flag: variance of the Laplacian of luma (at most 256 px a side) below",
                        &SO::blurry),
       NumberOption<SO>("extreme_aspect", {1, 1e6}, "flag: long side / short side above",
                        &SO::extreme_aspect),
       CountOption<SO>("tiny", 0, 65535, "flag: short side below (pixels)", &SO::tiny),
       BoolOption<SO>("save",
                      "keep mean and std in ARCHIVE/stats.json for loaders given mean=\"archive\"",
                      &SO::save),
       CountOption<SO>("max_pixels", 1, UINT64_MAX,
                       "refuse records declaring more pixels (as verify --decode and the loader)",
                       &SO::max_pixels)});
  return table;
}

Status ValidateStatsOptions(const StatsOptions& o) {
  if (o.workers < 0 || o.workers > 4096) {
    return Status::InvalidArgument("workers (--workers) must be in 0..4096, not ", o.workers);
  }
  if (o.size > 4096)
    return Status::InvalidArgument("size (--size) must be in 0..4096, not ", o.size);
  if (o.near_threshold < 0 || o.near_threshold > 16) {
    return Status::InvalidArgument("near_threshold (--near-threshold) must be in 0..16, not ",
                                   o.near_threshold);
  }
  for (auto [name, v, lo, hi] :
       {std::tuple{"dark", o.dark, 0.0, 255.0}, std::tuple{"bright", o.bright, 0.0, 255.0},
        std::tuple{"uniform", o.uniform, 0.0, 255.0}, std::tuple{"blurry", o.blurry, 0.0, 1e9},
        std::tuple{"extreme_aspect", o.extreme_aspect, 1.0, 1e6}}) {
    if (!(v >= lo && v <= hi)) {
      return Status::InvalidArgument(name, " must be in ", lo, "..", hi, ", not ", v);
    }
  }
  if (o.max_pixels == 0) return Status::InvalidArgument("max_pixels must be positive");
  return Status::OK();
}

namespace {

Histogram MakeHistogram(std::vector<double> edges, const std::vector<double>& values) {
  Histogram h;
  h.edges = std::move(edges);
  h.counts.assign(h.edges.size(), 0);
  if (values.empty()) return h;
  h.min = *std::min_element(values.begin(), values.end());
  h.max = *std::max_element(values.begin(), values.end());
  h.mean = std::accumulate(values.begin(), values.end(), 0.0) / double(values.size());
  for (double v : values) {
    size_t b = size_t(std::upper_bound(h.edges.begin(), h.edges.end(), v) - h.edges.begin());
    h.counts[b == 0 ? 0 : b - 1]++;
  }
  return h;
}

std::vector<double> Powers(double first, double last) {
  std::vector<double> e = {0};
  for (double v = first; v <= last; v *= 2) e.push_back(v);
  return e;
}

// Union-find over sample indices, for grouping pairs.
struct Groups {
  std::vector<uint32_t> parent;
  explicit Groups(size_t n) : parent(n) { std::iota(parent.begin(), parent.end(), 0u); }
  uint32_t Find(uint32_t x) {
    while (parent[x] != x) x = parent[x] = parent[parent[x]];
    return x;
  }
  void Join(uint32_t a, uint32_t b) {
    a = Find(a), b = Find(b);
    if (a != b) parent[std::max(a, b)] = std::min(a, b);
  }
  // Every set of two or more, each ascending, sets ordered by their first member.
  std::vector<std::vector<uint64_t>> Sets() {
    std::map<uint32_t, std::vector<uint64_t>> sets;
    for (uint32_t i = 0; i < parent.size(); ++i) sets[Find(i)].push_back(i);
    std::vector<std::vector<uint64_t>> out;
    for (auto& [root, members] : sets) {
      if (members.size() > 1) out.push_back(std::move(members));
    }
    return out;
  }
};

void FindDuplicates(const std::vector<SampleStat>& s, const StatsOptions& o, StatsReport* r) {
  const size_t n = s.size();
  Groups exact(n);
  std::unordered_map<uint64_t, uint32_t> first;  // pixel hash -> first sample holding it
  first.reserve(n);
  for (uint32_t i = 0; i < n; ++i) {
    if (!s[i].ok) continue;
    auto [it, added] = first.emplace(s[i].hash, i);
    if (!added) exact.Join(it->second, i);
  }
  r->duplicates = exact.Sets();
  for (const auto& g : r->duplicates) {
    for (uint64_t i : g) {
      if (s[i].label != s[g[0]].label) {
        r->cross_label_duplicates.push_back(g);
        break;
      }
    }
  }
  // Near: pairs within the threshold that are not the same pixels; uniform images (all
  // hashes alike) and failed samples take no part, nor the later copies of an exact duplicate
  // (the first stands for them: a third image near both put an exact pair in one near group).
  std::vector<uint64_t> hashes(n);
  std::vector<bool> skip(n);
  for (uint32_t i = 0; i < n; ++i) {
    hashes[i] = s[i].phash;
    skip[i] = !s[i].ok || s[i].luma_std < o.uniform || first[s[i].hash] != i;
  }
  Groups near(n);
  for (auto [a, b] : NearPairs(hashes, o.near_threshold, skip)) {
    if (s[a].hash != s[b].hash) near.Join(a, b);
  }
  r->near_duplicates = near.Sets();
}

void FindLeaks(const std::vector<SampleStat>& mine, const std::string& name,
               const std::vector<SampleStat>& theirs, const StatsOptions& o, StatsReport* r) {
  std::unordered_map<uint64_t, uint32_t> exact;
  for (uint32_t j = 0; j < theirs.size(); ++j) {
    if (theirs[j].ok) exact.emplace(theirs[j].hash, j);
  }
  std::vector<bool> exact_hit(mine.size());
  for (uint32_t i = 0; i < mine.size(); ++i) {
    if (!mine[i].ok) continue;
    if (auto it = exact.find(mine[i].hash); it != exact.end()) {
      r->leaks.push_back({i, name, it->second, true});
      exact_hit[i] = true;
    }
  }
  std::vector<uint64_t> hashes(theirs.size()), queries(mine.size());
  std::vector<bool> skip(theirs.size()), skip_query(mine.size());
  for (size_t j = 0; j < theirs.size(); ++j) {
    hashes[j] = theirs[j].phash;
    skip[j] = !theirs[j].ok || theirs[j].luma_std < o.uniform;
  }
  for (size_t i = 0; i < mine.size(); ++i) {
    queries[i] = mine[i].phash;
    skip_query[i] = exact_hit[i] || !mine[i].ok || mine[i].luma_std < o.uniform;
  }
  // One near leak per sample: its closest match.
  std::vector<std::pair<int, uint32_t>> best(mine.size(), {65, 0});
  for (auto [q, j] : NearMatches(hashes, queries, o.near_threshold, skip, skip_query)) {
    const int d = __builtin_popcountll(queries[q] ^ hashes[j]);
    if (d < best[q].first) best[q] = {d, j};
  }
  for (uint32_t i = 0; i < mine.size(); ++i) {
    if (best[i].first <= 64) r->leaks.push_back({i, name, best[i].second, false});
  }
}

void Summarize(const format::Archive& archive, const std::vector<SampleStat>& s,
               const StatsOptions& o, StatsReport* r) {
  const auto& m = archive.manifest();
  // Per-sample class counts only where the samples have a class field: without one (COCO's
  // per-box labels) every index entry's label is 0, and counting it made every image the first
  // category (and --fail-on imbalance always fail).
  if (archive.schema().label_field() >= 0) r->class_names = m.class_names;
  r->label_counts.assign(r->class_names.size(), 0);
  std::vector<double> widths, heights, aspects, bytes;
  for (uint64_t i = 0; i < s.size(); ++i) {
    const SampleStat& x = s[i];
    if (!x.ok) continue;  // in `errors`, and left out of everything else
    if (x.label >= 0 && size_t(x.label) < r->label_counts.size()) r->label_counts[x.label]++;
    bytes.push_back(double(x.bytes));
    r->decoded++;
    widths.push_back(x.width);
    heights.push_back(x.height);
    const double aspect = double(x.width) / x.height;
    aspects.push_back(aspect);
    r->grayscale += (x.color & (kGrayJpeg | kGrayPixels)) != 0;
    r->cmyk += (x.color & kCmyk) != 0;
    r->exif_rotated += (x.color & kRotated) != 0;
    if (x.luma_std < o.uniform) r->uniform.push_back(i);
    if (x.luma_mean < o.dark) r->dark.push_back(i);
    if (x.luma_mean > o.bright) r->bright.push_back(i);
    // A dark or uniform image has no edges to measure: flagged as such, not also as blurry.
    if (x.laplacian < o.blurry && x.luma_std >= o.uniform && x.luma_mean >= o.dark) {
      r->blurry.push_back(i);
    }
    if (std::max(aspect, 1 / aspect) > o.extreme_aspect) r->extreme_aspect.push_back(i);
    if (std::min(x.width, x.height) < o.tiny) r->tiny.push_back(i);
  }
  r->imbalance_ratio = std::numeric_limits<double>::quiet_NaN();  // no classes: null in JSON
  if (!r->label_counts.empty()) {
    const auto [lo, hi] = std::minmax_element(r->label_counts.begin(), r->label_counts.end());
    r->imbalance_ratio = *lo == 0 ? std::numeric_limits<double>::infinity() : double(*hi) / *lo;
  }
  r->width = MakeHistogram(Powers(16, 4096), widths);
  r->height = MakeHistogram(Powers(16, 4096), heights);
  r->aspect = MakeHistogram({0, 0.25, 0.5, 0.75, 0.9, 1.1, 1.34, 2, 4}, aspects);
  r->file_bytes = MakeHistogram(Powers(1024, 16 << 20), bytes);
}

json HistogramJson(const Histogram& h) {
  json bins = json::array();
  for (size_t i = 0; i < h.counts.size(); ++i) {
    bins.push_back({{"lo", h.edges[i]},
                    {"hi", i + 1 < h.edges.size() ? json(h.edges[i + 1]) : json(nullptr)},
                    {"count", h.counts[i]}});
  }
  return {{"min", h.min}, {"max", h.max}, {"mean", h.mean}, {"bins", bins}};
}

}  // namespace

namespace {

// The same archive given twice (tr.sf and ./tr.sf) would list each of its leaks twice.
Status CheckDistinct(const std::vector<OtherArchive>& against) {
  std::set<std::string> seen;
  for (const auto& a : against) {
    std::error_code ec;
    const std::string& p = a.archive->path();
    const std::string key =
        storage::IsRemote(p) ? p : std::filesystem::weakly_canonical(p, ec).string();
    if (!seen.insert(key).second) {
      return Status::InvalidArgument("against (--against): ", a.name,
                                     " is an archive given already");
    }
  }
  return Status::OK();
}

}  // namespace

Result<StatsReport> Stats(const format::Archive& archive, const StatsOptions& o,
                          const std::vector<OtherArchive>& against, const StatsProgress& progress) {
  SF_RETURN_IF_ERROR(ValidateStatsOptions(o));
  if (archive.size() > std::numeric_limits<uint32_t>::max()) {
    return Status::InvalidArgument(archive.path(), ": stats handles up to 2^32 samples");
  }
  // Before the pass, so that a refusal costs none; WriteStatsRecord decides again as it writes.
  if (o.save) SF_RETURN_IF_ERROR(format::CheckStatsRecordReplaceable(archive));
  SF_RETURN_IF_ERROR(CheckDistinct(against));
  uint64_t total = archive.size();
  for (const auto& a : against) total += a.archive->size();
  StatsReport r;
  r.archive = archive.path();
  r.samples = archive.size();
  r.size = o.size;
  r.options = o;
  Measured m = MeasureArchive(archive, o, progress, 0, total);
  if (Cancelled(o.cancel)) return Status::Cancelled(archive.path(), ": stats cancelled");
  SF_RETURN_IF_ERROR(m.changed);
  r.pixels = m.sums.pixels;
  for (int c = 0; c < 3; ++c) {
    if (m.sums.pixels == 0) break;
    const double n = double(m.sums.pixels);
    const double mean = double(m.sums.sum[c]) / n;
    // E[x^2] - E[x]^2 from exact integer sums: no cancellation worth the name at 8 bits.
    const double var = std::max(0.0, double(m.sums.squares[c]) / n - mean * mean);
    r.mean[c] = mean / 255.0;
    r.std[c] = std::sqrt(var) / 255.0;
  }
  r.errors = std::move(m.errors);
  Summarize(archive, m.samples, o, &r);
  std::vector<bool> left_out(m.samples.size());
  for (size_t i = 0; i < left_out.size(); ++i) left_out[i] = !m.samples[i].ok;
  r.fields_json = FieldSummaries(archive, left_out).dump();
  if (const int p = archive.schema().Find("path");
      p >= 0 && archive.schema().fields()[p].kind == format::FieldKind::kStr) {
    r.paths.resize(archive.size());
    for (uint64_t i = 0; i < archive.size(); ++i) {
      if (auto v = archive.Field(i, static_cast<size_t>(p)); v.ok()) {
        r.paths[i].assign(reinterpret_cast<const char*>(v->data), v->size);
      }
    }
  }
  uint64_t done = archive.size();
  std::vector<Measured> theirs;
  for (const auto& other : against) {
    StatsOptions hashing = o;
    hashing.size = 0;
    theirs.push_back(MeasureArchive(*other.archive, hashing, progress, done, total));
    if (Cancelled(o.cancel)) return Status::Cancelled(archive.path(), ": stats cancelled");
    SF_RETURN_IF_ERROR(theirs.back().changed);
    done += other.archive->size();
  }
  std::vector<std::pair<const format::Archive*, std::vector<SampleStat>*>> sets = {
      {&archive, &m.samples}};
  for (size_t k = 0; k < against.size(); ++k) {
    sets.emplace_back(against[k].archive.get(), &theirs[k].samples);
  }
  SF_RETURN_IF_ERROR(ConfirmExactDuplicates(sets, o));
  FindDuplicates(m.samples, o, &r);
  for (size_t k = 0; k < against.size(); ++k) {
    FindLeaks(m.samples, against[k].name, theirs[k].samples, o, &r);
  }
  if (progress) progress(total, total);
  if (o.save) {
    // A record the loader would refuse (mean="archive": "std must be at least 0.001") is not
    // written: said here, where the cause is seen.
    if (r.decoded == 0) {
      r.save_error = archive.path() + ": --save: no sample decoded, so no mean and std to save";
    }
    for (int c = 0; c < 3 && r.save_error.empty(); ++c) {
      if (!(r.std[c] >= format::kMinStd)) {
        r.save_error =
            Status::InvalidArgument(archive.path(), ": --save: the std of channel ", "RGB"[c],
                                    " is ", r.std[c], ", under the ", format::kMinStd,
                                    " a loader normalises with (every image one "
                                    "colour?); nothing saved")
                .message();
      }
    }
  }
  if (o.save && r.save_error.empty()) {
    format::StatsRecord rec;
    for (int c = 0; c < 3; ++c) rec.mean[c] = r.mean[c], rec.std[c] = r.std[c];
    rec.size = o.size;
    rec.samples = r.decoded;
    rec.fingerprint = format::ArchiveFingerprint(archive);
    SF_RETURN_IF_ERROR(format::WriteStatsRecord(archive, rec));
  }
  return r;
}

std::string StatsReport::ToJson() const {
  auto finite = [](double v) { return std::isfinite(v) ? json(v) : json(nullptr); };
  json j;
  j["archive"] = archive;
  j["samples"] = samples;
  j["decoded"] = decoded;
  j["size"] = size ? json(size) : json(nullptr);
  j["pixels"] = pixels;
  j["mean"] = {mean[0], mean[1], mean[2]};
  j["std"] = {std[0], std[1], std[2]};
  j["mean_255"] = {mean[0] * 255, mean[1] * 255, mean[2] * 255};
  j["std_255"] = {std[0] * 255, std[1] * 255, std[2] * 255};
  json counts = json::object();
  for (size_t c = 0; c < class_names.size(); ++c) counts[class_names[c]] = label_counts[c];
  j["labels"] = {{"names", class_names},
                 {"counts", label_counts},
                 {"by_name", counts},
                 {"imbalance_ratio", finite(imbalance_ratio)}};
  j["sizes"] = {{"width", HistogramJson(width)},   {"height", HistogramJson(height)},
                {"aspect", HistogramJson(aspect)}, {"file_bytes", HistogramJson(file_bytes)},
                {"grayscale", grayscale},          {"cmyk", cmyk},
                {"exif_rotated", exif_rotated}};
  j["flags"] = {{"uniform", uniform},
                {"dark", dark},
                {"bright", bright},
                {"blurry", blurry},
                {"extreme_aspect", extreme_aspect},
                {"tiny", tiny}};
  j["thresholds"] = {{"near_threshold", options.near_threshold},
                     {"dark", options.dark},
                     {"bright", options.bright},
                     {"uniform", options.uniform},
                     {"blurry", options.blurry},
                     {"extreme_aspect", options.extreme_aspect},
                     {"tiny", options.tiny}};
  json errs = json::array();
  for (const auto& [i, why] : errors) errs.push_back({{"index", i}, {"reason", why}});
  j["errors"] = errs;
  if (!save_error.empty()) j["save_error"] = save_error;
  j["duplicates"] = duplicates;
  j["near_duplicates"] = near_duplicates;
  j["cross_label_duplicates"] = cross_label_duplicates;
  json leak_list = json::array();
  for (const auto& l : leaks) {
    leak_list.push_back({{"index", l.index},
                         {"other", l.other},
                         {"other_index", l.other_index},
                         {"kind", l.exact ? "exact" : "near"}});
  }
  j["leaks"] = leak_list;
  j["fields"] = json::parse(fields_json, nullptr, false);
  if (!paths.empty()) {  // what names samples by index, again by source path
    auto path_of = [&](uint64_t i) { return i < paths.size() ? paths[i] : std::string(); };
    auto named = [&](const auto& groups) {
      json out = json::array();
      for (const auto& g : groups) {
        json group = json::array();
        for (uint64_t i : g) group.push_back(path_of(i));
        out.push_back(std::move(group));
      }
      return out;
    };
    j["duplicate_paths"] = named(duplicates);
    j["near_duplicate_paths"] = named(near_duplicates);
    j["cross_label_duplicate_paths"] = named(cross_label_duplicates);
    json flagged = json::object();
    for (const auto& [name, list] : j["flags"].items()) {
      json names = json::array();
      for (const auto& i : list) names.push_back(path_of(i.get<uint64_t>()));
      flagged[name] = std::move(names);
    }
    j["flag_paths"] = std::move(flagged);
    for (auto& e : j["errors"]) e["path"] = path_of(e["index"].get<uint64_t>());
    for (auto& l : j["leaks"]) l["path"] = path_of(l["index"].get<uint64_t>());
  }
  return j.dump(2, ' ', false, json::error_handler_t::replace) + "\n";
}

Result<FailOn> ParseFailOn(const std::string& text) {
  FailOn f;
  std::stringstream in(text);
  std::string item;
  // An empty item anywhere (",duplicates", "a,,b", "duplicates,") is refused below, the last too
  // (getline drops a trailing empty one).
  if (!text.empty() && text.back() == ',') {
    return Status::InvalidArgument("--fail-on: an empty item in '", text, "'");
  }
  while (std::getline(in, item, ',')) {
    if (item == "duplicates") {
      f.duplicates = true;
    } else if (item == "leaks") {
      f.leaks = true;
    } else if (item == "cross-label") {
      f.cross_label = true;
    } else if (item == "flags") {
      f.flags = true;
    } else if (item.rfind("imbalance=", 0) == 0) {
      const std::string v = item.substr(10);
      // Read strictly, as every number option (no sign, space, hex, inf or nan).
      if (!ParseNumberText(v, &f.imbalance) || !(f.imbalance >= 1)) {
        return Status::InvalidArgument("--fail-on imbalance=RATIO takes a number >= 1, not '", v,
                                       "'");
      }
    } else {
      return Status::InvalidArgument(
          "--fail-on takes duplicates, leaks, cross-label, flags, imbalance=RATIO (comma "
          "separated), not '",
          item, "'");
    }
  }
  return f;
}

std::string FailureSummary(const StatsReport& r, const FailOn& f) {
  std::vector<std::string> parts;
  auto count = [](size_t n, const char* what) {
    return std::to_string(n) + " " + what + (n == 1 ? "" : "s");
  };
  if (f.duplicates && !r.duplicates.empty()) {
    parts.push_back(count(r.duplicates.size(), "duplicate group"));
  }
  if (f.duplicates && !r.near_duplicates.empty()) {
    parts.push_back(count(r.near_duplicates.size(), "near-duplicate group"));
  }
  if (f.cross_label && !r.cross_label_duplicates.empty()) {
    parts.push_back(count(r.cross_label_duplicates.size(), "cross-label duplicate group"));
  }
  if (f.leaks && !r.leaks.empty()) parts.push_back(count(r.leaks.size(), "leak"));
  if (f.flags) {
    // Samples, not flags: a sample both tiny and dark is one flagged sample.
    std::vector<uint64_t> flagged;
    for (const auto* list :
         {&r.uniform, &r.dark, &r.bright, &r.blurry, &r.extreme_aspect, &r.tiny}) {
      flagged.insert(flagged.end(), list->begin(), list->end());
    }
    for (const auto& e : r.errors) flagged.push_back(e.first);
    std::sort(flagged.begin(), flagged.end());
    flagged.erase(std::unique(flagged.begin(), flagged.end()), flagged.end());
    if (!flagged.empty()) parts.push_back(count(flagged.size(), "flagged sample"));
  }
  if (f.imbalance > 0 && !r.class_names.empty() && !(r.imbalance_ratio <= f.imbalance)) {
    std::ostringstream o;
    o << "class imbalance " << r.imbalance_ratio << " > " << f.imbalance;
    parts.push_back(o.str());
  }
  std::string out;
  for (const auto& p : parts) out += (out.empty() ? "" : ", ") + p;
  return out;
}

}  // namespace shardfeed::validate
