#include "shardfeed/converter/pack.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "shardfeed/validate/extract.h"
#include "shardfeed/validate/verify.h"
#include "test_util.h"

namespace shardfeed::converter {
namespace {

using format::Archive;
using format::Encoding;
using testing::ReadBytes;
using testing::SampleDir;
using testing::TempDir;
using validate::Extract;
using validate::Verify;
using validate::VerifyOptions;
using validate::VerifyReport;
namespace fs = std::filesystem;

std::shared_ptr<Archive> PackOrDie(const SourceList& src, const std::string& out,
                                   const PackOptions& opt, PackResult* result = nullptr) {
  PackResult local;
  Status s = Pack(src, out, opt, result ? result : &local);
  INFO(s.ToString());
  REQUIRE(s.ok());
  auto a = Archive::Open(out);
  REQUIRE(a.ok());
  return *a;
}

bool IsJpegFile(const std::string& path) {
  auto b = ReadBytes(path);
  return imaging::SniffFormat(b.data(), b.size()) == imaging::ImageFormat::kJpeg;
}

TEST_CASE("scanning an image folder follows torchvision's classes and order") {
  auto src = ScanImageFolder(SampleDir());
  REQUIRE(src.ok());
  CHECK(src->class_names == std::vector<std::string>{"cat", "dog", "zebra"});
  REQUIRE(src->items.size() == 36);
  for (size_t i = 0; i < 36; ++i) {
    CHECK(src->items[i].label == static_cast<int32_t>(i / 12));
    if (i % 12) CHECK(src->items[i - 1].path < src->items[i].path);
  }
  // The .DS_Store files are ignored, not samples.
  CHECK(src->ignored.size() == 3);
}

TEST_CASE("jpeg packing keeps every JPEG byte-identical and labels right") {
  TempDir dir;
  auto src = ScanImageFolder(SampleDir());
  REQUIRE(src.ok());
  PackOptions opt;
  opt.encoding = Encoding::kJpeg;
  auto a = PackOrDie(*src, dir / "a", opt);
  REQUIRE(a->size() == src->items.size());
  CHECK(a->manifest().class_names == src->class_names);
  CHECK(a->manifest().class_counts == std::vector<uint64_t>{12, 12, 12});
  imaging::Decoder decoder;
  for (uint64_t i = 0; i < a->size(); ++i) {
    auto r = a->At(i).ValueOrDie();
    auto source = ReadBytes(src->items[i].path);
    CHECK(r.entry->label == src->items[i].label);
    if (IsJpegFile(src->items[i].path)) {
      REQUIRE(std::vector<uint8_t>(r.data, r.data + r.size) == source);
    } else {
      // PNG/BMP/WebP were encoded to JPEG once; same size as the source image.
      imaging::Image want, got;
      REQUIRE(decoder.Decode(source.data(), source.size(), &want, {}).ok());
      REQUIRE(decoder.Decode(r.data, r.size, &got, {}).ok());
      CHECK(got.width == want.width);
      CHECK(got.height == want.height);
    }
  }
  // extract gives the stored bytes back, in the source layout (the path field).
  auto n = Extract(*a, dir / "x");
  REQUIRE(n.ok());
  CHECK(*n == 36);
  const std::string first = fs::relative(src->items[0].path, SampleDir()).string();
  REQUIRE(IsJpegFile(src->items[0].path));
  CHECK(ReadBytes(dir / ("x/" + first)) == ReadBytes(src->items[0].path));
}

TEST_CASE("raw and zstd records hold exactly the converter's decode and resize") {
  TempDir dir;
  auto src = ScanImageFolder(SampleDir());
  REQUIRE(src.ok());
  for (Encoding enc : {Encoding::kRaw, Encoding::kZstd}) {
    for (bool crop : {false, true}) {
      PackOptions opt;
      opt.encoding = enc;
      opt.size = 40;
      opt.center_crop = crop;
      std::string out = dir / (std::string(format::EncodingName(enc)) + (crop ? "c" : "n"));
      auto a = PackOrDie(*src, out, opt);
      REQUIRE(a->size() == 36);
      if (crop) {
        CHECK(a->manifest().height == 40);
        CHECK(a->manifest().width == 40);
      }
      // extract writes PNGs (lossless), so comparing them compares the record pixels.
      REQUIRE(Extract(*a, out + "-x").ok());
      imaging::Decoder decoder;
      for (uint64_t i = 0; i < a->size(); ++i) {
        auto source = ReadBytes(src->items[i].path);
        imaging::Image want, got;
        REQUIRE(DecodeForRecord(decoder, source.data(), source.size(), opt, &want).ok());
        // extract writes the source layout back, the extension made the record's (.png).
        std::string png = out + "-x/" +
                          fs::path(fs::relative(src->items[i].path, SampleDir()))
                              .replace_extension(".png")
                              .string();
        auto png_bytes = ReadBytes(png);
        REQUIRE(decoder.Decode(png_bytes.data(), png_bytes.size(), &got, {}).ok());
        INFO(src->items[i].path);
        REQUIRE(got.width == want.width);
        REQUIRE(got.height == want.height);
        REQUIRE(std::min(got.width, got.height) == 40u);
        REQUIRE(got.pixels == want.pixels);
      }
      VerifyOptions vo;
      vo.decode = true;
      CHECK(Verify(*a, vo).ok());
    }
  }
}

TEST_CASE("the archive does not depend on the worker count; shuffle is seeded") {
  TempDir dir;
  auto src = ScanImageFolder(SampleDir());
  REQUIRE(src.ok());
  for (Encoding enc : {Encoding::kJpeg, Encoding::kZstd}) {
    PackOptions opt;
    opt.encoding = enc;
    opt.size = enc == Encoding::kJpeg ? 0 : 32;
    opt.workers = 1;
    auto one = PackOrDie(*src, dir / "w1", opt);
    opt.workers = 2;
    auto two = PackOrDie(*src, dir / "w2", opt);
    opt.workers = 7;
    auto seven = PackOrDie(*src, dir / "w7", opt);
    REQUIRE(one->size() == two->size());
    for (uint64_t i = 0; i < one->size(); ++i) {
      REQUIRE(one->At(i).ValueOrDie().entry->checksum == two->At(i).ValueOrDie().entry->checksum);
      REQUIRE(one->At(i).ValueOrDie().entry->checksum == seven->At(i).ValueOrDie().entry->checksum);
      REQUIRE(one->At(i).ValueOrDie().entry->label == two->At(i).ValueOrDie().entry->label);
    }
    CHECK(one->manifest().shards[0].content_hash == two->manifest().shards[0].content_hash);
    one.reset(), two.reset(), seven.reset();
    fs::remove_all(dir / "w1"), fs::remove_all(dir / "w2"), fs::remove_all(dir / "w7");
  }
  PackOptions opt;
  opt.shuffle = true;
  opt.seed = 5;
  auto s1 = PackOrDie(*src, dir / "s1", opt);
  opt.workers = 1;
  auto s2 = PackOrDie(*src, dir / "s2", opt);
  opt.seed = 6;
  auto s3 = PackOrDie(*src, dir / "s3", opt);
  std::multiset<uint64_t> all1, all3;
  bool same_as_other_seed = true;
  for (uint64_t i = 0; i < s1->size(); ++i) {
    REQUIRE(s1->At(i).ValueOrDie().entry->checksum == s2->At(i).ValueOrDie().entry->checksum);
    same_as_other_seed &=
        s1->At(i).ValueOrDie().entry->checksum == s3->At(i).ValueOrDie().entry->checksum;
    all1.insert(s1->At(i).ValueOrDie().entry->checksum);
    all3.insert(s3->At(i).ValueOrDie().entry->checksum);
  }
  CHECK(!same_as_other_seed);
  CHECK(all1 == all3);
}

TEST_CASE("bad files are skipped with reasons; strict leaves no archive") {
  TempDir dir;
  // A class folder of good images plus the folder of broken ones.
  fs::create_directories(dir / "src");
  fs::copy(SampleDir() + "/cat", dir / "src/cat", fs::copy_options::recursive);
  fs::copy(testing::BadDir() + "/broken", dir / "src/broken",
           fs::copy_options::recursive | fs::copy_options::copy_symlinks);
  auto src = ScanImageFolder(dir / "src");
  REQUIRE(src.ok());
  PackOptions opt;
  PackResult result;
  auto a = PackOrDie(*src, dir / "a", opt, &result);
  CHECK(a->size() == 12);
  std::map<std::string, std::string> reasons;
  for (const auto& s : result.skipped) reasons[fs::path(s.path).filename().string()] = s.reason;
  CHECK(reasons.size() == 9);
  CHECK(reasons["empty.jpg"] == "empty file");
  CHECK(reasons["truncated.jpg"].find("truncated") != std::string::npos);
  CHECK(reasons["header_only.jpg"].find("truncated") != std::string::npos);
  CHECK(reasons["not_an_image.jpg"].find("not an image") != std::string::npos);
  CHECK(reasons["html.jpeg"].find("not an image") != std::string::npos);
  CHECK(reasons["random.png"].find("not an image") != std::string::npos);
  CHECK(reasons["truncated.png"].find("PNG") != std::string::npos);
  CHECK(reasons["dangling.jpg"].find("dangling") != std::string::npos);
  CHECK(reasons["bomb.jpg"].find("exceeds the limit") != std::string::npos);
  std::string json = PackReportJson(result, dir / "src");
  CHECK(json.find("bomb.jpg") != std::string::npos);

  // raw decodes everything, so the same files are refused for the same reasons.
  opt.encoding = Encoding::kRaw;
  opt.size = 32;
  auto raw = PackOrDie(*src, dir / "raw", opt, &result);
  CHECK(raw->size() == 12);
  CHECK(result.skipped.size() == 9);

  opt.strict = true;
  Status s = Pack(*src, dir / "strict", opt, &result);
  CHECK(!s.ok());
  CHECK(s.message().find("broken/") != std::string::npos);
  CHECK(!fs::exists(dir / "strict"));
  CHECK(!fs::exists(dir / "strict.partial"));
}

TEST_CASE("full validation also rejects JPEGs whose entropy data is damaged") {
  TempDir dir;
  fs::create_directories(dir / "src/c");
  auto good = ReadBytes(SampleDir() + "/cat/cat_000.jpg");
  testing::WriteBytes(dir / "src/c/good.jpg", good);
  // Cut the scan short but keep a valid end marker: headers and the EOI scan look fine.
  std::vector<uint8_t> cut(good.begin(), good.begin() + good.size() / 3);
  cut.push_back(0xFF);
  cut.push_back(0xD9);
  testing::WriteBytes(dir / "src/c/cut.jpg", cut);
  auto src = ScanImageFolder(dir / "src");
  REQUIRE(src.ok());
  PackOptions opt;
  PackResult result;
  CHECK(PackOrDie(*src, dir / "header", opt, &result)->size() == 2);
  opt.validation = Validation::kFull;
  CHECK(PackOrDie(*src, dir / "full", opt, &result)->size() == 1);
  REQUIRE(result.skipped.size() == 1);
  CHECK(result.skipped[0].path.find("cut.jpg") != std::string::npos);
}

TEST_CASE("a list file gives paths and labels") {
  TempDir dir;
  auto folder = ScanImageFolder(SampleDir());
  REQUIRE(folder.ok());
  {
    std::ofstream list(dir / "list.txt");
    list << "# path label\n\n";
    for (size_t i = 0; i < folder->items.size(); i += 3) {
      std::string rel = fs::relative(folder->items[i].path, SampleDir()).string();
      list << rel << " " << (folder->items[i].label * 2) << "\n";
    }
  }
  auto src = ReadListFile(dir / "list.txt", SampleDir());
  REQUIRE(src.ok());
  CHECK(src->items.size() == 12);
  CHECK(src->class_names.size() == 5);  // labels 0, 2, 4 -> classes "0".."4"
  auto a = PackOrDie(*src, dir / "a", PackOptions());
  CHECK(a->At(11).ValueOrDie().entry->label == 4);
  {
    std::ofstream bad(dir / "bad.txt");
    bad << "a.jpg 1\nb.jpg x\n";
  }
  auto refused = ReadListFile(dir / "bad.txt", SampleDir());
  CHECK(refused.status().message().find("bad.txt:2") != std::string::npos);
}

TEST_CASE("verify names the sample whose payload was damaged") {
  TempDir dir;
  auto src = ScanImageFolder(SampleDir());
  REQUIRE(src.ok());
  PackOptions opt;
  std::string sample17;
  {
    auto a = PackOrDie(*src, dir / "a", opt);
    auto r = a->At(17).ValueOrDie();
    sample17.assign(reinterpret_cast<const char*>(r.data), r.size);
  }
  std::string shard = dir / "a/shard-00000.mdb";
  auto bytes = ReadBytes(shard);
  std::string file(bytes.begin(), bytes.end());
  size_t at = file.find(sample17);
  REQUIRE(at != std::string::npos);
  bytes[at + sample17.size() / 2] ^= 0x01;
  testing::WriteBytes(shard, bytes);
  auto a = Archive::Open(dir / "a");
  REQUIRE(a.ok());
  VerifyReport report = Verify(**a, {});
  CHECK(!report.ok());
  REQUIRE(report.bad_samples.size() == 1);
  CHECK(report.bad_samples[0].index == 17);
  CHECK(report.bad_shards.size() == 1);
  CHECK(report.ToJson().find("\"index\": 17") != std::string::npos);
}

TEST_CASE("extract from a lazily opened archive opens each shard it reads") {
  // Before: Extract read records through Archive::Get, which dereferenced a shard not opened yet.
  TempDir dir;
  auto src = ScanImageFolder(SampleDir());
  REQUIRE(src.ok());
  PackOptions opt;
  opt.writer.shard_bytes = 4096;  // several shards
  PackOrDie(*src, dir / "a", opt);
  auto lazy = Archive::Open(dir / "a", format::IndexCheck::kLazy);
  REQUIRE(lazy.ok());
  REQUIRE((*lazy)->manifest().shards.size() > 2);
  REQUIRE((*lazy)->OpenedShards() == 0);
  auto n = Extract(**lazy, dir / "x");
  INFO(n.status().ToString());
  REQUIRE(n.ok());
  CHECK(*n == (*lazy)->size());
  CHECK((*lazy)->OpenedShards() == (*lazy)->manifest().shards.size());
}

}  // namespace
}  // namespace shardfeed::converter
