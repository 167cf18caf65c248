// validate/: verify, inspect and extract at the library level. The commands' side is in
// tests/cli/test_data_safety.py and tests/cli/test_stats.py.
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "../../validate/src/pixel_measures.h"
#include "../reader/constant_archive.h"
#include "shardfeed/converter/convert.h"
#include "shardfeed/converter/pack.h"
#include "shardfeed/format/archive.h"
#include "shardfeed/format/stats_record.h"
#include "shardfeed/validate/extract.h"
#include "shardfeed/validate/inspect.h"
#include "shardfeed/validate/stats.h"
#include "shardfeed/validate/verify.h"
#include "test_util.h"

namespace shardfeed::validate {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

// A zstd frame that declares `content` bytes and holds one empty raw block.
std::vector<uint8_t> FrameDeclaring(uint64_t content) {
  std::vector<uint8_t> f = {0x28, 0xB5, 0x2F, 0xFD, 0xE0};  // magic; single segment, 8-byte size
  for (int i = 0; i < 8; ++i) f.push_back(static_cast<uint8_t>(content >> (8 * i)));
  f.insert(f.end(), {0x01, 0x00, 0x00});  // last block, raw, 0 bytes
  return f;
}

// An archive of one zstd record whose checksums are all valid and whose entry declares
// side x side pixels.
std::shared_ptr<format::Archive> ArchiveDeclaring(const std::string& path, uint16_t side) {
  format::WriterOptions wo;
  wo.encoding = format::Encoding::kZstd;
  auto w = format::ArchiveWriter::Create(path, wo);
  REQUIRE(w.ok());
  format::IndexEntry e{};
  e.height = e.width = side;
  e.channels = 3;
  e.encoding = static_cast<uint8_t>(format::Encoding::kZstd);
  e.orientation = 1;
  auto frame = FrameDeclaring(uint64_t{side} * side * 3);
  REQUIRE((*w)->Append(e, frame.data(), frame.size()).ok());
  format::Manifest m;
  m.encoding = format::Encoding::kZstd;
  m.class_names = {"x"};
  REQUIRE((*w)->Finish(m).ok());
  auto archive = format::Archive::Open(path);
  REQUIRE(archive.ok());
  return *archive;
}

std::vector<std::string> Entries(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

TEST_CASE("extract refuses a record above the pixel limit before decompressing it") {
  // Issue 19: extract decompressed what verify --decode, the loader and inspect --grid refuse.
  TempDir dir;
  auto archive = ArchiveDeclaring(dir / "a", 20000);
  auto n = Extract(*archive, dir / "x");
  REQUIRE(!n.ok());
  CHECK(n.status().code() == StatusCode::kResourceExhausted);
  CHECK(n.status().message().find("sample 0: record declares 20000x20000") != std::string::npos);
  CHECK(Entries(dir.path()) == std::vector<std::string>{"a"});  // nothing written
  imaging::Image img;
  Status decoded = DecodeSample(*archive, 0, &img);  // what inspect --grid does
  CHECK(decoded.code() == StatusCode::kResourceExhausted);

  // The limit is the caller's, the same number for everyone: below it the record is read.
  auto small = ArchiveDeclaring(dir / "b", 40);
  ExtractOptions tight;
  tight.max_pixels = 40 * 40 - 1;
  CHECK(Extract(*small, dir / "y", tight).status().code() == StatusCode::kResourceExhausted);
  VerifyOptions vo;
  vo.decode = true;
  vo.max_pixels = tight.max_pixels;
  CHECK(!Verify(*small, vo).ok());
}

TEST_CASE("a cancelled verify stops: no sample checked, VerifyPath returns kCancelled") {
  TempDir dir;
  auto archive = ArchiveDeclaring(dir / "a", 40);
  CancelToken cancel;
  VerifyOptions vo;
  vo.cancel = &cancel;
  CHECK(Verify(*archive, vo).checked == 1);
  cancel.Cancel();
  CHECK(Verify(*archive, vo).checked == 0);
  CHECK(VerifyPath(dir / "a", vo).status().code() == StatusCode::kCancelled);
}

TEST_CASE("a cancelled stats or convert stops with kCancelled and writes nothing") {
  TempDir dir;
  auto archive = testing::MakeConstantArchive(dir / "a", 300, 16);
  CancelToken cancel;
  cancel.Cancel();
  StatsOptions o;
  o.cancel = &cancel;
  auto r = Stats(*archive, o, {}, {});
  CHECK(r.status().code() == StatusCode::kCancelled);
  auto n = converter::Convert(*archive, dir / "b", format::Backend::kHdf5, false, false, &cancel);
  CHECK(n.status().code() == StatusCode::kCancelled);
  CHECK_FALSE(std::filesystem::exists(dir / "b"));
  CHECK_FALSE(std::filesystem::exists(dir / "b.partial"));
}

TEST_CASE("a failed extract leaves nothing behind, a finished one everything") {
  TempDir dir;
  auto src = converter::ScanImageFolder(testing::SampleDir());
  REQUIRE(src.ok());
  converter::PackOptions po;
  po.encoding = format::Encoding::kZstd;
  po.size = 24;
  converter::PackResult result;
  REQUIRE(converter::Pack(*src, dir / "a", po, &result).ok());
  auto archive = format::Archive::Open(dir / "a");
  REQUIRE(archive.ok());
  // An existing empty folder is taken; the files appear only at the end.
  fs::create_directories(dir / "out");
  auto n = Extract(**archive, dir / "out");
  REQUIRE(n.ok());
  CHECK(*n == 36);
  CHECK(Entries(dir / "out") == std::vector<std::string>{"cat", "dog", "zebra"});
  CHECK(Entries(dir / "out/cat").size() == 12);
  CHECK(Entries(dir.path()) == std::vector<std::string>{"a", "out"});
  // A folder that is not empty is never touched.
  auto again = Extract(**archive, dir / "out");
  CHECK(again.status().code() == StatusCode::kInvalidArgument);
  CHECK(Entries(dir / "out/cat").size() == 12);

  // A record that fails midway: no partial folder, and the same call works once it is fixed.
  auto bad = ArchiveDeclaring(dir / "b", 20000);
  CHECK(!Extract(*bad, dir / "x").ok());
  CHECK(!fs::exists(dir / "x"));
  CHECK(Entries(dir.path()) == std::vector<std::string>{"a", "b", "out"});
  ExtractOptions roomy;
  roomy.max_pixels = uint64_t{20000} * 20000;
  auto second = Extract(*bad, dir / "x", roomy);  // now the frame itself is found short
  CHECK(second.status().code() == StatusCode::kCorrupt);
  CHECK(Entries(dir.path()) == std::vector<std::string>{"a", "b", "out"});
}

// What PlantAtStatsPath writes at stats.json when WriteStatsRecord's final step is about to run.
std::string planted;
void PlantAtStatsPath(const std::string& path) { std::ofstream(path, std::ios::trunc) << planted; }

std::string FileText(const fs::path& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

bool HasTemporary(const std::string& dir) {
  for (const std::string& name : Entries(dir)) {
    if (name.find(".tmp-") != std::string::npos) return true;
  }
  return false;
}

TEST_CASE(
    "stats --save never replaces a stats.json that is not ours, even one put there meanwhile") {
  // Issue 23: --save checked the file before its pass, then renamed its record over whatever was
  // there at the end: a user's stats.json created in between was silently replaced.
  TempDir dir;
  auto archive = ArchiveDeclaring(dir / "a", 4);
  const fs::path stats = fs::path(dir / "a") / "stats.json";
  format::StatsRecord rec;
  rec.mean = {0.25, 0.5, 0.75};
  rec.std = {0.1, 0.2, 0.3};
  rec.samples = 1;
  rec.fingerprint = format::ArchiveFingerprint(*archive);
  auto refused = [&](const Status& st, const char* reason) {
    INFO(st.ToString());
    CHECK(st.code() == StatusCode::kInvalidArgument);
    CHECK(st.message().find(stats.string()) != std::string::npos);
    CHECK(st.message().find("not written by shardfeed stats --save") != std::string::npos);
    CHECK(st.message().find(reason) != std::string::npos);
    CHECK(!HasTemporary(dir / "a"));
  };

  SECTION("a user's file there when the record is written (made after stats' own check)") {
    std::ofstream(stats) << "{\"my\": \"own notes\"}\n";
    refused(format::WriteStatsRecord(*archive, rec), "exists");
    CHECK(FileText(stats) == "{\"my\": \"own notes\"}\n");
    CHECK(format::CheckStatsRecordReplaceable(*archive).code() == StatusCode::kInvalidArgument);
  }
  SECTION("none there when looked at, a user's file appears right before the rename") {
    planted = "mine\n";
    format::internal::SetStatsBeforeFinalStepHookForTest(PlantAtStatsPath);
    refused(format::WriteStatsRecord(*archive, rec), "appeared while saving");
    format::internal::SetStatsBeforeFinalStepHookForTest(nullptr);
    CHECK(FileText(stats) == "mine\n");
  }
  SECTION("a record of ours there, a user's file put in its place right before the exchange") {
    REQUIRE(format::WriteStatsRecord(*archive, rec).ok());
    planted = "{\"format\": \"theirs\"}";
    format::internal::SetStatsBeforeFinalStepHookForTest(PlantAtStatsPath);
    refused(format::WriteStatsRecord(*archive, rec), "appeared while saving");
    format::internal::SetStatsBeforeFinalStepHookForTest(nullptr);
    CHECK(FileText(stats) == "{\"format\": \"theirs\"}");
  }
  SECTION("records of ours are replaced, also one that appears meanwhile (another --save)") {
    REQUIRE(format::WriteStatsRecord(*archive, rec).ok());
    const std::string first = FileText(stats);
    fs::remove(stats);
    planted = first;
    format::internal::SetStatsBeforeFinalStepHookForTest(PlantAtStatsPath);
    rec.mean[0] = 0.125;
    const Status st = format::WriteStatsRecord(*archive, rec);
    format::internal::SetStatsBeforeFinalStepHookForTest(nullptr);
    REQUIRE(st.ok());
    rec.mean[1] = 0.0625;
    REQUIRE(format::WriteStatsRecord(*archive, rec).ok());
    auto back = format::ReadStatsRecord(*archive);
    REQUIRE(back.ok());
    CHECK(back->mean[0] == 0.125);
    CHECK(back->mean[1] == 0.0625);
    CHECK(!HasTemporary(dir / "a"));
  }
}

TEST_CASE("Printable escapes control and bidirectional-override characters") {
  CHECK(Printable("cat") == "cat");
  CHECK(Printable("caf\xc3\xa9") == "caf\xc3\xa9");  // é stays
  CHECK(Printable("a\x1b[31mb") == "a\\x1b[31mb");
  CHECK(Printable("x\\y") == "x\\\\y");
  CHECK(Printable("\xc2\x85") == "\\xc2\\x85");  // C1 NEL
  // U+202E RIGHT-TO-LEFT OVERRIDE (e2 80 ae) makes "gpj.exe" show as "exe.jpg".
  CHECK(Printable("doc\xe2\x80\xaegpj.exe") == "doc\\xe2\\x80\\xaegpj.exe");
  CHECK(Printable("\xe2\x81\xa6x\xe2\x81\xa9") == "\\xe2\\x81\\xa6x\\xe2\\x81\\xa9");  // U+2066/9
  CHECK(Printable("\xe2\x80\x8f") == "\\xe2\\x80\\x8f");                               // U+200F
  CHECK(Printable("\xff") == "\\xff");
}

TEST_CASE("the multi-index search finds exactly the pairs an all-pairs scan finds") {
  std::mt19937_64 rng(7);
  std::vector<uint64_t> hashes;
  for (int i = 0; i < 3000; ++i) hashes.push_back(rng());
  // Clusters: copies of a few hashes with 0..16 bits flipped, so every distance is exercised.
  for (int i = 0; i < 1500; ++i) {
    uint64_t h = hashes[rng() % 50];
    const int flips = int(rng() % 17);
    for (int k = 0; k < flips; ++k) h ^= uint64_t{1} << (rng() % 64);
    hashes.push_back(h);
  }
  std::vector<bool> skip(hashes.size());
  for (size_t i = 0; i < skip.size(); i += 37) skip[i] = true;
  for (int threshold : {0, 3, 8, 10, 16}) {
    std::vector<std::pair<uint32_t, uint32_t>> want;
    for (uint32_t i = 0; i < hashes.size(); ++i) {
      for (uint32_t j = i + 1; j < hashes.size(); ++j) {
        if (!skip[i] && !skip[j] && __builtin_popcountll(hashes[i] ^ hashes[j]) <= threshold) {
          want.emplace_back(i, j);
        }
      }
    }
    INFO("threshold " << threshold);
    CHECK(NearPairs(hashes, threshold, skip) == want);
    CHECK(!want.empty());
  }
}

TEST_CASE("the perceptual hash of an image and of a uniform image") {
  imaging::Image img;
  img.Resize(100, 80, 3);
  for (uint32_t y = 0; y < img.height; ++y) {
    for (uint32_t x = 0; x < img.width; ++x) {
      uint8_t* p = img.pixels.data() + (size_t{y} * img.width + x) * 3;
      p[0] = uint8_t(x * 2), p[1] = uint8_t(y * 3), p[2] = uint8_t((x * y) % 256);
    }
  }
  const uint64_t h = PerceptualHash(img.pixels.data(), img.width, img.height, 0);
  CHECK(h == PerceptualHash(img.pixels.data(), img.width, img.height, 0));  // deterministic
  // Brighter by a constant: the AC coefficients and their median move together.
  imaging::Image brighter = img;
  for (auto& v : brighter.pixels) v = uint8_t(std::min(255, v + 10));
  CHECK(__builtin_popcountll(h ^ PerceptualHash(brighter.pixels.data(), 100, 80, 0)) <= 10);
  CHECK(__builtin_popcountll(h) > 8);  // not degenerate
}

TEST_CASE("stats' per-channel sums equal a plain loop at every length and alignment") {
  std::mt19937 rng(7);
  std::vector<uint8_t> pixels(3 * 5000 + 64);
  for (auto& v : pixels) v = uint8_t(rng());
  // Lengths around the SIMD kernel's 192-byte pairs and its 128-pair flush, odd offsets.
  for (size_t count :
       {0, 1, 31, 32, 63, 64, 65, 127, 128, 129, 255, 256, 257, 4095, 4096, 4097, 5000}) {
    for (size_t offset : {0, 1, 7}) {
      if (offset + 3 * count > pixels.size()) continue;
      const uint8_t* p = pixels.data() + offset;
      uint64_t sum[3] = {}, squares[3] = {};
      for (size_t i = 0; i < 3 * count; ++i) sum[i % 3] += p[i], squares[i % 3] += p[i] * p[i];
      for (int level : {0, 1, 2}) {  // the best kernel the CPU has, AVX2, portable
        ForceAvx2PixelLoops(level == 1);
        ForcePortablePixelLoops(level == 2);
        PixelSums s;
        s.Add(p, count);
        ForceAvx2PixelLoops(false);
        ForcePortablePixelLoops(false);
        INFO("count " << count << " offset " << offset << " level " << level);
        CHECK(s.pixels == count);
        for (int c = 0; c < 3; ++c) {
          CHECK(s.sum[c] == sum[c]);
          CHECK(s.squares[c] == squares[c]);
        }
      }
    }
  }
  // All 255: the largest values the 16- and 32-bit lanes hold before they are flushed.
  std::vector<uint8_t> white(3 * 100000, 255);
  for (bool avx2 : {false, true}) {
    ForceAvx2PixelLoops(avx2);
    PixelSums s;
    s.Add(white.data(), 100000);
    ForceAvx2PixelLoops(false);
    CHECK(s.sum[1] == 255ull * 100000);
    CHECK(s.squares[2] == 255ull * 255 * 100000);
  }
}

TEST_CASE("stats' SIMD and portable pixel loops give the same sums and luma measures") {
  std::mt19937 rng(11);
  for (auto [w, h] : {std::pair{37u, 29u}, {256u, 256u}, {300u, 201u}, {801u, 77u}}) {
    std::vector<uint8_t> img(size_t{w} * h * 3);
    for (auto& v : img) v = uint8_t(rng() % 7 == 0 ? 255 : rng());
    PixelScratch scratch;
    const PixelMeasures a = MeasurePixels(img.data(), w, h, &scratch);
    ForcePortablePixelLoops(true);
    const PixelMeasures b = MeasurePixels(img.data(), w, h, &scratch);
    ForcePortablePixelLoops(false);
    const PixelSums &fast = a.sums, &slow = b.sums;
    INFO(w << "x" << h);
    CHECK(a.key == b.key);
    CHECK(a.luma.phash == b.luma.phash);
    CHECK(a.luma.mean == b.luma.mean);
    CHECK(a.luma.std == b.luma.std);
    CHECK(a.luma.laplacian == b.luma.laplacian);
    CHECK(a.luma.gray == b.luma.gray);
    for (int c = 0; c < 3; ++c) {
      CHECK(fast.sum[c] == slow.sum[c]);
      CHECK(fast.squares[c] == slow.squares[c]);
    }
  }
}

TEST_CASE("stats' luma measures of a flat, a gray and an edged image") {
  PixelScratch scratch;
  std::vector<uint8_t> flat(300 * 200 * 3, 90);  // 300 px: sampled every 2nd pixel
  LumaMeasures m = MeasureLuma(flat.data(), 300, 200, &scratch);
  CHECK(m.mean == 90.f);
  CHECK(m.std == 0.f);
  CHECK(m.laplacian == 0.f);
  CHECK(m.gray);
  // Left half black, right half white: a mean of 127.5, std 127.5, colour only where R != G.
  std::vector<uint8_t> edge(64 * 64 * 3, 0);
  for (uint32_t y = 0; y < 64; ++y) {
    for (uint32_t x = 32; x < 64; ++x) std::fill_n(&edge[(y * 64 + x) * 3], 3, 255);
  }
  m = MeasureLuma(edge.data(), 64, 64, &scratch);
  CHECK(m.mean == Approx(127.5));
  CHECK(m.std == Approx(127.5));
  CHECK(m.laplacian > 1000);
  CHECK(m.gray);
  edge[0] = 1;
  CHECK(!MeasureLuma(edge.data(), 64, 64, &scratch).gray);
}

}  // namespace
}  // namespace shardfeed::validate

namespace shardfeed::validate {
namespace {

TEST_CASE("--fail-on flags counts samples, not flags") {
  // A sample both tiny and dark, another both blurry and undecodable: two samples, four flags
  // (said "4 flagged samples" before).
  StatsReport r;
  r.tiny = {3};
  r.dark = {3};
  r.blurry = {7};
  r.errors = {{7, "corrupt JPEG data"}};
  auto f = ParseFailOn("flags");
  REQUIRE(f.ok());
  CHECK(FailureSummary(r, *f) == "2 flagged samples");
}

TEST_CASE("stats over a shard cut short while mapped fails: its figures cannot be trusted") {
  // (Review) It listed every later sample as a broken image and reported figures.
  TempDir dir;
  auto archive = testing::MakeConstantArchive(dir / "a", 600, 32);
  std::string shard;
  for (const auto& f : std::filesystem::directory_iterator(dir / "a")) {
    if (f.path().filename().string().rfind("shard-", 0) == 0) shard = f.path().string();
  }
  REQUIRE(::truncate(shard.c_str(), 64 << 10) == 0);
  StatsOptions o;
  o.workers = 2;
  auto r = Stats(*archive, o, {}, {});
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == StatusCode::kChanged);
  CHECK(r.status().message().find("changed on disk while in use") != std::string::npos);
}

}  // namespace
}  // namespace shardfeed::validate
