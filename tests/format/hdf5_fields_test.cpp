// Typed fields in HDF5 shards that hold /images (fixed-shape raw/zstd records): the var blobs
// live in the var stream /shardfeed/var (docs/FORMAT.md, "A shard (HDF5)"), so h5py users keep
// `images[i]` whatever the schema. Round trip, lazy and full opens, convert, crafted damage.
#include <zstd.h>

#include <cstring>
#include <filesystem>

#include "fields_util.h"
#include "shardfeed/converter/convert.h"
#include "shardfeed/format/archive.h"
#include "shardfeed/format/fields.h"
#include "test_util.h"

namespace shardfeed::format {
namespace {

using testing::TempDir;
using namespace testing_fields;
namespace fs = std::filesystem;

constexpr uint16_t kH = 6, kW = 5;
constexpr const char* kSchema = R"({"image": "image", "label": "int64", "path": "str",
  "boxes": "boxes", "box_labels": {"type": "int64[*]", "per": "boxes"}, "mask": "mask",
  "score": "float32"})";

Schema TestSchema() {
  auto s = Schema::FromJson(kSchema);
  REQUIRE(s.ok());
  return *s;
}

// Sample i: its pixels (raw) and its values, with kH x kW masks.
std::vector<uint8_t> Pixels(uint64_t i) {
  std::vector<uint8_t> px(size_t{kH} * kW * 3);
  for (size_t k = 0; k < px.size(); ++k) px[k] = static_cast<uint8_t>(k * 7 + i * 13);
  return px;
}
Sample Values(const Schema& schema, uint64_t i) {
  Sample s;
  s.bytes.resize(schema.size());
  s.dims.resize(schema.size());
  const uint32_t rows = static_cast<uint32_t>(i % 4);  // 0 boxes included
  s.bytes[schema.Find("path")] = Text("dir/img-" + std::to_string(i) + "-\xc3\xa9.png");
  std::vector<float> boxes;
  std::vector<int64_t> labels;
  for (uint32_t r = 0; r < rows; ++r) {
    boxes.insert(boxes.end(), {float(r), float(i) / 3.0f, float(r + 2), 4.5f + float(i)});
    labels.push_back(int64_t(i) * 100 + r);
  }
  s.bytes[schema.Find("boxes")] = Bytes(boxes);
  s.dims[schema.Find("boxes")] = {rows, 4};
  s.bytes[schema.Find("box_labels")] = Bytes(labels);
  s.dims[schema.Find("box_labels")] = {rows};
  auto& mask = s.bytes[schema.Find("mask")];
  mask.resize(size_t{kH} * kW);
  for (size_t k = 0; k < mask.size(); ++k) mask[k] = static_cast<uint8_t>((k + i) % 5);
  s.dims[schema.Find("mask")] = {kH, kW};
  s.bytes[schema.Find("score")] = Bytes(std::vector<float>{float(i) * 0.25f});
  return s;
}

std::vector<uint8_t> Record(uint64_t i, Encoding encoding) {
  std::vector<uint8_t> px = Pixels(i);
  if (encoding == Encoding::kRaw) return px;
  std::vector<uint8_t> z(ZSTD_compressBound(px.size()));
  z.resize(ZSTD_compress(z.data(), z.size(), px.data(), px.size(), 1));
  return z;
}

void Write(const std::string& path, Encoding encoding, uint64_t n, uint64_t shard_bytes = 0) {
  WriterOptions opt;
  opt.backend = Backend::kHdf5;
  opt.encoding = encoding;
  opt.height = kH;
  opt.width = kW;
  opt.shard_bytes = shard_bytes;
  opt.schema = TestSchema();
  auto w = ArchiveWriter::Create(path, opt);
  REQUIRE(w.ok());
  for (uint64_t i = 0; i < n; ++i) {
    IndexEntry e{};
    e.label = static_cast<int32_t>(i % 3);
    e.height = kH, e.width = kW, e.channels = 3, e.orientation = 1;
    e.encoding = uint8_t(encoding);
    const auto rec = Record(i, encoding);
    Status st = (*w)->Append(e, rec.data(), rec.size(), Values(opt.schema, i).Values());
    INFO(st.ToString());
    REQUIRE(st.ok());
  }
  Manifest m = ThreeClasses();
  m.encoding = encoding;
  REQUIRE((*w)->Finish(m).ok());
}

// Every record and field reads back bit-exact; verify passes.
void Check(const Archive& a, Encoding encoding, uint64_t n) {
  const Schema schema = TestSchema();
  REQUIRE(a.size() == n);
  REQUIRE(a.schema() == schema);
  for (uint64_t i = 0; i < n; ++i) {
    INFO("sample " << i);
    auto r = a.At(i);
    REQUIRE(r.ok());
    CHECK(std::vector<uint8_t>(r->data, r->data + r->size) == Record(i, encoding));
    CHECK(r->entry->label == int32_t(i % 3));
    REQUIRE(a.VerifyRecord(i).ok());
    const Sample want = Values(schema, i);
    for (const char* name : {"path", "boxes", "box_labels", "mask", "score"}) {
      INFO(name);
      const int f = schema.Find(name);
      auto v = a.Field(i, f, /*verify=*/true);
      INFO(v.status().ToString());
      REQUIRE(v.ok());
      if (schema.fields()[f].kind == FieldKind::kMask) {
        REQUIRE(v->ndim == 2);
        CHECK((v->dims[0] == kH && v->dims[1] == kW));
        std::vector<uint8_t> mask(size_t{kH} * kW);
        REQUIRE(DecodeMask(*v, mask.data()).ok());
        CHECK(mask == want.bytes[f]);
        continue;
      }
      CHECK(std::vector<uint8_t>(v->data, v->data + v->size) == want.bytes[f]);
      if (!want.dims[f].empty()) {
        CHECK(std::vector<uint32_t>(v->dims.begin(), v->dims.begin() + v->ndim) == want.dims[f]);
      }
    }
  }
  REQUIRE(a.VerifyDerived().ok());
  for (size_t s = 0; s < a.manifest().shards.size(); ++s) REQUIRE(a.VerifyShard(s).ok());
}

// The archive's shards hold /images: one record per chunk, each at offset 0 (a /records shard
// of the default 1 MiB chunks puts many of these small records in one chunk). h5py's view of
// /images is checked by tests/python/test_h5py.py.
bool HoldsImages(const Archive& a) {
  for (const ShardInfo& s : a.manifest().shards) {
    if (s.chunk_count != s.sample_count) return false;
  }
  for (uint64_t i = 0; i < a.size(); ++i) {
    auto r = a.At(i);
    if (!r.ok() || r->entry->offset != 0) return false;
  }
  return a.size() > 0;
}

TEST_CASE("HDF5 /images archives keep str, boxes and mask fields in /shardfeed/var",
          "[fields][hdf5]") {
  const Encoding encoding = GENERATE(Encoding::kRaw, Encoding::kZstd);
  INFO(EncodingName(encoding));
  TempDir dir;
  // Several shards, each with its own var stream.
  Write(dir / "a", encoding, 30, /*shard_bytes=*/2000);
  for (IndexCheck check : {IndexCheck::kFull, IndexCheck::kLazy}) {
    auto a = Archive::Open(dir / "a", check);
    INFO(a.status().ToString());
    REQUIRE(a.ok());
    REQUIRE((*a)->manifest().shards.size() > 1);
    Check(**a, encoding, 30);
  }
  auto a = Archive::Open(dir / "a");
  REQUIRE(a.ok());
  CHECK(HoldsImages(**a));
}

TEST_CASE("convert lmdb <-> hdf5 /images keeps every field", "[fields][hdf5]") {
  TempDir dir;
  Write(dir / "h", Encoding::kZstd, 12);
  auto h = Archive::Open(dir / "h");
  REQUIRE(h.ok());
  auto l = converter::Convert(**h, dir / "l", Backend::kLmdb);
  INFO(l.status().ToString());
  REQUIRE(l.ok());
  auto lmdb = Archive::Open(dir / "l");
  REQUIRE(lmdb.ok());
  Check(**lmdb, Encoding::kZstd, 12);
  auto back = converter::Convert(**lmdb, dir / "h2", Backend::kHdf5);
  INFO(back.status().ToString());
  REQUIRE(back.ok());
  auto again = Archive::Open(dir / "h2");
  REQUIRE(again.ok());
  Check(**again, Encoding::kZstd, 12);
  CHECK(HoldsImages(**h));
  CHECK(HoldsImages(**again));
  // Same records, fields and layout: the same shard hash as the first HDF5 archive.
  CHECK((*again)->manifest().shards[0].content_hash == (*h)->manifest().shards[0].content_hash);
}

TEST_CASE("a var entry pointing outside /shardfeed/var is an error, never a read past it",
          "[fields][hdf5]") {
  TempDir dir;
  const std::string path = dir / "a";
  Write(path, Encoding::kRaw, 8);
  const std::string shard = (fs::path(path) / "shard-00000.h5").string();
  const Schema schema = TestSchema();
  // The stored fields table, found in the file through the archive's view of the score column.
  std::vector<uint8_t> table;
  {
    auto a = Archive::Open(path);
    REQUIRE(a.ok());
    auto v = (*a)->Field(0, schema.Find("score"));
    REQUIRE(v.ok());
    REQUIRE(schema.ColumnOffset(schema.Find("score"), 8) == 0);
    table.assign(v->data, v->data + schema.TableSize(8));
  }
  const size_t at = schema.VarColumnOffset(8) + 5 * sizeof(VarEntry);
  const uint32_t chunk = GENERATE(0u, 1u);  // past the stream's end; a chunk number it lacks
  auto crafted = table;
  VarEntry v;
  std::memcpy(&v, crafted.data() + at, sizeof v);
  if (chunk == 0) v.offset += 1 << 20;
  v.chunk = chunk;
  std::memcpy(crafted.data() + at, &v, sizeof v);
  auto bytes = testing::ReadBytes(shard);
  auto it = std::search(bytes.begin(), bytes.end(), table.begin(), table.end());
  REQUIRE(it != bytes.end());
  std::copy(crafted.begin(), crafted.end(), it);
  testing::WriteBytes(shard, bytes);

  auto lazy = Archive::Open(path, IndexCheck::kLazy);
  REQUIRE(lazy.ok());
  auto bad = (*lazy)->Field(5, schema.Find("path"));
  INFO(bad.status().ToString());
  REQUIRE(!bad.ok());
  CHECK(bad.status().code() == StatusCode::kCorrupt);
  CHECK(bad.status().message().find("sample 5") != std::string::npos);
  CHECK(bad.status().message().find("/shardfeed/var") != std::string::npos);
  CHECK((*lazy)->Field(4, schema.Find("path")).ok());  // the others still read
  CHECK((*lazy)->At(5).ok());
  CHECK(!(*lazy)->VerifyDerived().ok());
  auto full = Archive::Open(path, IndexCheck::kFull);
  CHECK(!full.ok());
}

}  // namespace
}  // namespace shardfeed::format
