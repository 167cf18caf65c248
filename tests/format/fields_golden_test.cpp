// Golden archives of format version 4 (tests/format/golden/v4, written once by
// scripts/make_golden_v4.py through the hidden test "[.make_golden_v4]" below): every later build
// must read every field of them back exactly as expected.json says. A matching mistake in the
// writer and the reader under test cannot pass here, since these files were not written by it.
#include <zstd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "fields_util.h"
#include "shardfeed/format/archive.h"
#include "test_util.h"

namespace shardfeed::format {
namespace {

using nlohmann::json;
using namespace testing_fields;
namespace fs = std::filesystem;

std::string Hex(const uint8_t* p, size_t n) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < n; ++i) {
    out += digits[p[i] >> 4];
    out += digits[p[i] & 15];
  }
  return out;
}

// A field's stored value as expected.json records it: its dims and its bytes (masks: pixels).
json ValueJson(const FieldView& v, const FieldSpec& spec) {
  json dims = json::array();
  for (uint32_t d = 0; d < v.ndim; ++d) dims.push_back(v.dims[d]);
  if (spec.kind == FieldKind::kMask) {
    std::vector<uint8_t> pixels(size_t{v.dims[0]} * v.dims[1]);
    REQUIRE(DecodeMask(v, pixels.data()).ok());
    return {{"dims", dims}, {"hex", Hex(pixels.data(), pixels.size())}};
  }
  return {{"dims", dims}, {"hex", Hex(v.data, v.size)}};
}

// Every field of every sample but the image and the class field.
json FieldsJson(const Archive& a) {
  const Schema& schema = a.schema();
  json samples = json::array();
  for (uint64_t i = 0; i < a.size(); ++i) {
    json fields = json::object();
    for (size_t f = 0; f < schema.size(); ++f) {
      if (int(f) == schema.image_field() || int(f) == schema.label_field()) continue;
      auto v = a.Field(i, f, /*verify=*/true);
      INFO(v.status().ToString());
      REQUIRE(v.ok());
      fields[schema.fields()[f].name] = ValueJson(*v, schema.fields()[f]);
    }
    samples.push_back(std::move(fields));
  }
  return samples;
}

std::string GoldenDir() { return SHARDFEED_SOURCE_DIR "/tests/format/golden/v4"; }

TEST_CASE("golden version-4 archives read every field as expected.json says", "[fields]") {
  std::ifstream in(GoldenDir() + "/expected.json");
  REQUIRE(in.good());
  const json expected = json::parse(in);
  REQUIRE(expected.size() >= 3);
  for (const auto& [name, want] : expected.items()) {
    INFO(name);
    for (IndexCheck check : {IndexCheck::kFull, IndexCheck::kLazy}) {
      auto a = Archive::Open(GoldenDir() + "/" + name, check);
      INFO(a.status().ToString());
      REQUIRE(a.ok());
      CHECK((*a)->manifest().format_version == 4);
      CHECK(json::parse((*a)->schema().ToJson()) == want.at("fields"));
      CHECK(FieldsJson(**a) == want.at("values"));
      CHECK((*a)->VerifyDerived().ok());
      for (size_t s = 0; s < (*a)->manifest().shards.size(); ++s) CHECK((*a)->VerifyShard(s).ok());
    }
  }
}

constexpr const char* kGoldenSchema = R"({
  "image": "image", "label": "int64", "path": "str", "score": "float32", "weight": "float64",
  "count": "int64", "boxes": "boxes", "box_labels": {"type": "int64[*]", "per": "boxes"},
  "mask": "mask", "blob": "bytes", "meta": "json", "emb": "float32[4]", "tags": "int64[*]",
  "patch": "uint8[*,*,3]", "half": "float16[2]", "ids": "int32[3]"})";

// Writes one golden archive: 6 samples of pixel records (raw or zstd) in 2 shards.
void WriteGolden(const std::string& path, Backend backend, Encoding encoding, bool fixed_shape,
                 const Schema& schema) {
  WriterOptions opt;
  opt.backend = backend;
  opt.encoding = encoding;
  opt.chunk_bytes = 512;
  opt.schema = schema;
  if (fixed_shape) opt.height = 6, opt.width = 8;
  auto w = ArchiveWriter::Create(path, opt);
  REQUIRE(w.ok());
  for (uint64_t i = 0; i < 6; ++i) {
    if (i == 3) REQUIRE((*w)->NextShard().ok());
    IndexEntry e = EntryFor(i);
    if (fixed_shape) e.height = 6, e.width = 8;
    e.encoding = uint8_t(encoding);
    std::vector<uint8_t> px(size_t{e.height} * e.width * 3);
    for (size_t k = 0; k < px.size(); ++k) px[k] = static_cast<uint8_t>(k * (i + 3) + i * 40);
    if (encoding == Encoding::kZstd) {
      std::vector<uint8_t> z(ZSTD_compressBound(px.size()));
      z.resize(ZSTD_compress(z.data(), z.size(), px.data(), px.size(), 3));
      px = z;
    }
    Sample s = MakeSample(schema, i);
    if (fixed_shape) {  // MakeSample's masks follow EntryFor's shapes: none in this schema
      REQUIRE(schema.Find("mask") < 0);
    }
    REQUIRE((*w)->Append(e, px.data(), px.size(), s.Values()).ok());
  }
  Manifest m;
  m.encoding = encoding;
  m.class_names = {"ant", "bee", "cat"};
  m.created_by = "shardfeed golden v4 (tests/format/fields_golden_test.cpp)";
  REQUIRE((*w)->Finish(m).ok());
}

// Run once, by scripts/make_golden_v4.py, to write the golden archives and their fields'
// expectations into $SHARDFEED_GOLDEN_V4_OUT (never into the committed directory).
TEST_CASE("write the version-4 golden archives", "[.make_golden_v4]") {
  const char* out = std::getenv("SHARDFEED_GOLDEN_V4_OUT");
  REQUIRE(out != nullptr);
  auto all = Schema::FromJson(kGoldenSchema);
  auto fixed = Schema::FromJson(
      R"({"image": "image", "label": "int64", "score": "float32", "emb": "float32[3]"})");
  REQUIRE(all.ok());
  REQUIRE(fixed.ok());
  WriteGolden(std::string(out) + "/lmdb-fields", Backend::kLmdb, Encoding::kRaw, false, *all);
  WriteGolden(std::string(out) + "/hdf5-fields", Backend::kHdf5, Encoding::kZstd, false, *all);
  WriteGolden(std::string(out) + "/hdf5-fixed", Backend::kHdf5, Encoding::kRaw, true, *fixed);
  json fields = json::object();
  for (const char* name : {"lmdb-fields", "hdf5-fields", "hdf5-fixed"}) {
    auto a = Archive::Open(std::string(out) + "/" + name);
    REQUIRE(a.ok());
    fields[name] = {{"fields", json::parse((*a)->schema().ToJson())}, {"values", FieldsJson(**a)}};
  }
  std::ofstream(std::string(out) + "/fields.json") << fields.dump(1) << "\n";
}

}  // namespace
}  // namespace shardfeed::format
