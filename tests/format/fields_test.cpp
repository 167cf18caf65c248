// Typed per-sample fields (format version 4): schemas, the values a writer takes (a bad one
// refused, naming the field) and the views a reader returns, on both backends.
#include "shardfeed/format/fields.h"

#include <xxhash.h>
#include <zstd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "fields_util.h"
#include "shardfeed/converter/convert.h"
#include "shardfeed/converter/pack.h"
#include "shardfeed/format/archive.h"
#include "test_util.h"

namespace shardfeed::format {
namespace {

using testing::TempDir;
using namespace testing_fields;
namespace fs = std::filesystem;

TEST_CASE("every field type round-trips bit-exact on both backends", "[fields]") {
  const Schema schema = AllTypes();
  for (Backend backend : {Backend::kLmdb, Backend::kHdf5}) {
    INFO(BackendName(backend));
    TempDir dir;
    WriterOptions opt;
    opt.backend = backend;
    opt.chunk_bytes = 4096;   // many chunks: blobs at every position
    opt.shard_bytes = 40000;  // several shards
    WriteFields(dir / "a", schema, 60, opt);
    for (IndexCheck check : {IndexCheck::kFull, IndexCheck::kLazy}) {
      auto a = Archive::Open(dir / "a", check);
      INFO(a.status().ToString());
      REQUIRE(a.ok());
      REQUIRE((*a)->manifest().shards.size() > 1);
      CheckFields(**a, schema, 60);
      REQUIRE((*a)->VerifyDerived().ok());
      for (size_t s = 0; s < (*a)->manifest().shards.size(); ++s) {
        REQUIRE((*a)->VerifyShard(s).ok());
      }
    }
  }
}

// ---- Schemas ---------------------------------------------------------------------------------

TEST_CASE("a user's schema keeps its order and prints canonical type names", "[fields]") {
  const Schema s = AllTypes();
  std::vector<std::string> names;
  for (const auto& f : s.fields()) names.push_back(f.name);
  CHECK(names == std::vector<std::string>{"image", "label", "path", "score", "weight", "count",
                                          "boxes", "box_labels", "mask", "blob", "meta", "emb",
                                          "tags", "patch", "half", "ids"});
  CHECK(s.image_field() == 0);
  CHECK(s.label_field() == 1);
  CHECK(s.fields()[s.Find("box_labels")].per == "boxes");
  CHECK(s.fields()[s.Find("patch")].TypeName() == "uint8[*,*,3]");
  CHECK(s.fields()[s.Find("emb")].fixed());
  CHECK(s.fields()[s.Find("emb")].item_bytes() == 2048);
  CHECK(!s.fields()[s.Find("tags")].fixed());
  // The manifest form reads back as the same schema; spaces in a type are accepted.
  auto again = Schema::FromJson(s.ToJson());
  REQUIRE(again.ok());
  CHECK(*again == s);
  auto spaced = Schema::FromJson(R"({"img": "image", "xy": "float32[ *, 4 ]"})");
  REQUIRE(spaced.ok());
  CHECK(spaced->fields()[1].TypeName() == "float32[*,4]");
  CHECK(spaced->label_field() == -1);
  // "label" of another type is an ordinary field, not the class field.
  auto text_label = Schema::FromJson(R"({"image": "image", "label": "str"})");
  REQUIRE(text_label.ok());
  CHECK(text_label->label_field() == -1);
  CHECK(Schema::Legacy().legacy());
  CHECK(!Schema::ImageFolder().legacy());
}

TEST_CASE("bad schemas are refused naming the field and the reason", "[fields]") {
  struct Case {
    const char* json;
    const char* says;
  };
  const Case cases[] = {
      {R"({"image": "image", "x": "int8"})", "x"},
      {R"({"image": "image", "x": "float32[0]"})", "x"},
      {R"({"image": "image", "x": "float32[]"})", "x"},
      {R"({"image": "image", "x": "float32[1,2,3,4,5]"})", "at most 4 dims"},
      {R"({"image": "image", "x": "uint8[1000000000]"})", "x"},
      {R"({"image": "image", "x": "float64[4096,4096]"})", "16 MiB"},
      {R"({"image": "image", "x": "uint8[*"})", "x"},
      {R"({"image": "image", "x": 3})", "the type is a string"},
      {R"({"image": "image", "x": {"type": "str", "shape": 3}})", "unknown key 'shape'"},
      {R"({"image": "image", "x": {"per": "boxes"}})", "no \"type\""},
      {R"({"image": "image", "1x": "str"})", "1x"},
      {R"({"image": "image", "a-b": "str"})", "a-b"},
      {R"({"image": "image", "": "str"})", "names are"},
      {R"({"image": "image", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa": "str"})",
       "at most 64"},
      {R"([{"name": "image", "type": "image"}, {"name": "x", "type": "str"},
          {"name": "x", "type": "int64"}])",
       "'x' twice"},
      {R"({"caption": "str"})", "no field of type image"},
      {R"({"a": "image", "b": "image"})", "one image field"},
      {R"({"image": "image", "l": {"type": "int64[*]", "per": "boxes"}, "boxes": "boxes"})",
       "declared before"},
      {R"({"image": "image", "s": "str", "l": {"type": "int64[*]", "per": "s"}})",
       "must name a boxes field"},
      {R"({"image": "image", "boxes": "boxes", "l": {"type": "int64[3]", "per": "boxes"}})",
       "first dim is *"},
      {R"({"image": "image", "boxes": "boxes", "l": {"type": "str", "per": "boxes"}})",
       "first dim is *"},
      {R"([{"type": "image"}])", "each field is"},
      {R"("image")", "a JSON object"},
      {R"({"image": "image",)", "not JSON"},
  };
  for (const Case& c : cases) {
    INFO(c.json);
    auto s = Schema::FromJson(c.json);
    REQUIRE(!s.ok());
    CHECK(s.status().code() == StatusCode::kInvalidArgument);
    CHECK(s.status().message().find(c.says) != std::string::npos);
  }
  std::string many = R"({"image": "image")";
  for (int i = 0; i < 64; ++i) many += ", \"f" + std::to_string(i) + "\": \"str\"";
  auto s = Schema::FromJson(many + "}");
  REQUIRE(!s.ok());
  CHECK(s.status().message().find("at most 64 fields") != std::string::npos);
}

// ---- Writing ---------------------------------------------------------------------------------

TEST_CASE("a bad value is refused naming the field, and nothing of its sample is written",
          "[fields]") {
  const Schema schema = AllTypes();
  TempDir dir;
  WriterOptions opt;
  opt.schema = schema;
  auto w = ArchiveWriter::Create(dir / "a", opt);
  REQUIRE(w.ok());
  const auto p = Payload(0);
  using Edit = void (*)(const Schema&, Sample&);
  struct Case {
    const char* name;
    Edit edit;
    const char* says;
  };
  const Case cases[] = {
      {"mask of another shape", [](const Schema& s, Sample& x) { x.dims[s.Find("mask")][0] += 1; },
       "'mask'"},
      {"per-box rows",
       [](const Schema& s, Sample& x) {
         x.dims[s.Find("box_labels")][0] += 1;
         x.bytes[s.Find("box_labels")].resize(x.bytes[s.Find("box_labels")].size() + 8);
       },
       "'box_labels'"},
      {"missing", [](const Schema& s, Sample& x) { x.bytes[s.Find("meta")].clear(); },
       "'meta'"},  // "" is not JSON
      {"invalid UTF-8",
       [](const Schema& s, Sample& x) {
         x.bytes[s.Find("path")] = {0xC3, 0x28};
       },
       "'path'"},
      {"NaN box",
       [](const Schema& s, Sample& x) {
         auto& b = x.bytes[s.Find("boxes")];
         x.dims[s.Find("boxes")][0] = 1;
         x.dims[s.Find("box_labels")][0] = 1;
         x.bytes[s.Find("box_labels")].assign(8, 0);
         const float nan = std::nanf("");
         b.assign(16, 0);
         std::memcpy(b.data() + 4, &nan, 4);
       },
       "is NaN, infinite"},
      {"fixed array shape", [](const Schema& s, Sample& x) { x.dims[s.Find("ids")][0] = 4; },
       "'ids'"},
      {"scalar size", [](const Schema& s, Sample& x) { x.bytes[s.Find("score")].resize(8); },
       "'score'"},
      {"bytes vs dims", [](const Schema& s, Sample& x) { x.bytes[s.Find("tags")].push_back(0); },
       "'tags'"},
  };
  for (const Case& c : cases) {
    INFO(c.name);
    Sample bad = MakeSample(schema, 0);
    c.edit(schema, bad);
    Status st = (*w)->Append(EntryFor(0), p.data(), p.size(), bad.Values());
    REQUIRE(!st.ok());
    CHECK(st.code() == StatusCode::kInvalidArgument);
    CHECK(st.message().find(c.says) != std::string::npos);
    CHECK((*w)->samples_written() == 0);
    CHECK((*w)->bytes_written() == 0);
  }
  const Sample kept = MakeSample(schema, 0);  // owns the bytes the values point at
  FieldValues absent = kept.Values();
  absent[schema.Find("tags")].present = false;
  Status st = (*w)->Append(EntryFor(0), p.data(), p.size(), absent);
  CHECK(st.message().find("'tags'") != std::string::npos);
  // The legacy Append cannot leave fields out.
  st = (*w)->Append(EntryFor(0), p.data(), p.size());
  CHECK(st.code() == StatusCode::kInvalidArgument);
  CHECK((*w)->samples_written() == 0);
  // After all that, good samples make an archive holding exactly them.
  for (uint64_t i = 0; i < 3; ++i) {
    const auto q = Payload(i);
    REQUIRE((*w)->Append(EntryFor(i), q.data(), q.size(), MakeSample(schema, i).Values()).ok());
  }
  REQUIRE((*w)->Finish(ThreeClasses()).ok());
  auto a = Archive::Open(dir / "a");
  REQUIRE(a.ok());
  CheckFields(**a, schema, 3);
  CHECK((*a)->VerifyDerived().ok());
}

TEST_CASE("a schema without a class field: labels are 0, class names optional, no counts",
          "[fields]") {
  auto schema = Schema::FromJson(R"({"image": "image", "caption": "str", "emb": "float32[4]"})");
  REQUIRE(schema.ok());
  for (bool names : {false, true}) {
    TempDir dir;
    WriterOptions opt;
    opt.schema = *schema;
    auto w = ArchiveWriter::Create(dir / "a", opt);
    REQUIRE(w.ok());
    const auto p = Payload(1);
    IndexEntry labelled = EntryFor(1);  // label 1
    Status st = (*w)->Append(labelled, p.data(), p.size(), MakeSample(*schema, 1).Values());
    CHECK(st.code() == StatusCode::kInvalidArgument);
    for (uint64_t i = 0; i < 5; ++i) {
      IndexEntry e = EntryFor(i);
      e.label = 0;
      const auto q = Payload(i);
      REQUIRE((*w)->Append(e, q.data(), q.size(), MakeSample(*schema, i).Values()).ok());
    }
    Manifest m;
    if (names) m.class_names = {"person", "car"};  // e.g. the names of per-box labels
    REQUIRE((*w)->Finish(m).ok());
    std::ifstream in(dir / "a/manifest.json");
    std::stringstream text;
    text << in.rdbuf();
    CHECK(text.str().find("class_counts") == std::string::npos);
    for (IndexCheck check : {IndexCheck::kFull, IndexCheck::kLazy}) {
      auto a = Archive::Open(dir / "a", check);
      INFO(a.status().ToString());
      REQUIRE(a.ok());
      CHECK((*a)->manifest().class_names.size() == (names ? 2u : 0u));
      CHECK((*a)->manifest().class_counts.empty());
      CHECK((*a)->VerifyDerived().ok());
      for (uint64_t i = 0; i < 5; ++i) {
        CHECK((*a)->Label(i) == 0);
        auto caption = (*a)->Field(i, 1, true);
        REQUIRE(caption.ok());
        const auto want = MakeSample(*schema, i).bytes[1];
        CHECK(std::string(caption->data, caption->data + caption->size) ==
              std::string(want.begin(), want.end()));
      }
      // The image and a field that does not exist are not fields to read.
      CHECK((*a)->Field(0, 0).status().code() == StatusCode::kInvalidArgument);
      CHECK((*a)->Field(0, 3).status().code() == StatusCode::kInvalidArgument);
      CHECK((*a)->Field(5, 1).status().code() == StatusCode::kInvalidArgument);
    }
  }
}

TEST_CASE("fixed-shape raw/zstd HDF5 archives keep /images with fixed and variable fields",
          "[fields]") {
  for (const char* json : {R"({"image": "image", "label": "int64", "score": "float64"})",
                           R"({"image": "image", "label": "int64", "tags": "int64[*]"})"}) {
    INFO(json);
    auto schema = Schema::FromJson(json);
    REQUIRE(schema.ok());
    for (Encoding encoding : {Encoding::kRaw, Encoding::kZstd}) {
      TempDir dir;
      WriterOptions opt;
      opt.backend = Backend::kHdf5;
      opt.encoding = encoding;
      opt.height = 6;
      opt.width = 5;
      opt.schema = *schema;
      auto w = ArchiveWriter::Create(dir / "a", opt);
      REQUIRE(w.ok());
      std::vector<std::vector<uint8_t>> pixels;
      for (uint64_t i = 0; i < 7; ++i) {
        IndexEntry e = EntryFor(i);
        e.height = 6, e.width = 5, e.encoding = uint8_t(Encoding::kRaw);
        std::vector<uint8_t> px(6 * 5 * 3, static_cast<uint8_t>(i * 9));
        if (encoding == Encoding::kZstd) {
          e.encoding = uint8_t(Encoding::kZstd);
          std::vector<uint8_t> z(ZSTD_compressBound(px.size()));
          z.resize(ZSTD_compress(z.data(), z.size(), px.data(), px.size(), 1));
          px = z;
        }
        pixels.push_back(px);
        Sample s = MakeSample(*schema, i);
        REQUIRE((*w)->Append(e, px.data(), px.size(), s.Values()).ok());
      }
      Manifest m = ThreeClasses();
      m.encoding = encoding;
      REQUIRE((*w)->Finish(m).ok());
      auto a = Archive::Open(dir / "a");
      INFO(a.status().ToString());
      REQUIRE(a.ok());
      for (uint64_t i = 0; i < 7; ++i) {
        auto r = (*a)->At(i);
        REQUIRE(r.ok());
        REQUIRE(std::vector<uint8_t>(r->data, r->data + r->size) == pixels[i]);
        auto v = (*a)->Field(i, 2, true);
        REQUIRE(v.ok());
        CHECK(std::vector<uint8_t>(v->data, v->data + v->size) == MakeSample(*schema, i).bytes[2]);
      }
      CHECK((*a)->VerifyDerived().ok());
      CHECK((*a)->VerifyShard(0).ok());
    }
  }
}

// Regression: VarField multiplied the dims and checked the product after each step, so with 4
// dims the product could wrap around 2^64 to the value's size (here 0) and a view promising
// 2^20 x 2^20 x 2^24 bytes over an empty value was returned.
TEST_CASE("dims whose product wraps around are refused", "[fields]") {
  auto schema = Schema::FromJson(R"({"image": "image", "grid": "uint8[*,*,*,*]"})");
  REQUIRE(schema.ok());
  FieldValues values(2);
  values[1].present = true;
  values[1].ndim = 4;
  values[1].dims = {1, 1, 1, 0};  // an empty array
  std::vector<uint8_t> blob;
  REQUIRE(EncodeVarBlob(*schema, values, 1, &blob).ok());
  REQUIRE(VarField(*schema, blob.data(), blob.size(), 1).ok());
  VarSlot slot;
  std::memcpy(&slot, blob.data(), sizeof slot);
  const uint32_t dims[4] = {1u << 20, 1u << 20, 1u << 24, 1};
  std::memcpy(blob.data() + slot.offset, dims, sizeof dims);
  auto v = VarField(*schema, blob.data(), blob.size(), 1);
  REQUIRE(!v.ok());
  CHECK(v.status().code() == StatusCode::kCorrupt);
  CHECK(v.status().message().find("'grid'") != std::string::npos);
}

// Boxes given at an address not aligned for float (a view of an HDF5 chunk, a slice of a
// caller's buffer) are checked through memcpy (UBSan flagged the float loads before).
TEST_CASE("boxes at an unaligned address are checked", "[fields]") {
  auto schema = Schema::FromJson(R"({"image": "image", "boxes": "boxes"})");
  REQUIRE(schema.ok());
  std::vector<uint8_t> buffer(1 + 2 * 16);
  const float box[8] = {1, 2, 3, 4, 5, 6, 7, std::nanf("")};
  std::memcpy(buffer.data() + 1, box, sizeof box);
  FieldValue v;
  v.present = true;
  v.data = buffer.data() + 1;
  v.size = sizeof box;
  v.ndim = 2;
  v.dims = {2, 4};
  Status st = CheckValue(schema->fields()[1], v, 8, 8, -1);
  CHECK(st.code() == StatusCode::kInvalidArgument);
  CHECK(st.message().find("box 1 has a coordinate that is NaN, infinite or beyond +-1e30") !=
        std::string::npos);
  v.size = 16;
  v.dims = {1, 4};
  CHECK(CheckValue(schema->fields()[1], v, 8, 8, -1).ok());
}

// Regression (hostile review of issue 21): an inverted box (x1 < x0 or y1 < y0, COCO's negative
// width or height) was stored and later dropped silently by the loader's geometry. Refused at
// write time, naming the field and the box; an empty box (x0 == x1) is a box.
TEST_CASE("inverted boxes are refused where they are written", "[fields]") {
  auto schema = Schema::FromJson(R"({"image": "image", "boxes": "boxes"})");
  REQUIRE(schema.ok());
  const std::vector<std::vector<float>> bad = {{1, 2, 3, 4, 5, 6, 4, 7}, {1, 2, 3, 4, 5, 6, 7, 5}};
  auto boxes = [](const float* data, uint32_t rows) {
    FieldValue v;
    v.present = true;
    v.data = data;
    v.size = size_t{rows} * 16;
    v.ndim = 2;
    v.dims = {rows, 4};
    return v;
  };
  for (const std::vector<float>& box : bad) {
    FieldValue v = boxes(box.data(), 2);
    Status st = CheckValue(schema->fields()[1], v, 8, 8, -1);
    CHECK(st.code() == StatusCode::kInvalidArgument);
    CHECK(st.message().find("field 'boxes'") != std::string::npos);
    CHECK(st.message().find("box 1 [5, 6, ") != std::string::npos);
    CHECK(st.message().find("is inverted") != std::string::npos);
  }
  const float empty[4] = {3, 3, 3, 9};
  CHECK(CheckValue(schema->fields()[1], boxes(empty, 1), 8, 8, -1).ok());
  // Through the writer: nothing of the sample is written.
  TempDir dir;
  WriterOptions wo;
  wo.schema = *schema;
  auto writer = ArchiveWriter::Create(dir / "a", wo);
  REQUIRE(writer.ok());
  IndexEntry e = EntryFor(0);
  e.label = 0;
  const auto payload = Payload(0);
  FieldValues values(2);
  values[1] = boxes(bad[0].data(), 2);
  Status st = (*writer)->Append(e, payload.data(), payload.size(), values);
  CHECK(st.code() == StatusCode::kInvalidArgument);
  CHECK(st.message().find("is inverted") != std::string::npos);
}

}  // namespace
}  // namespace shardfeed::format
