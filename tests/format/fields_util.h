// Helpers of the typed-fields tests (fields_test.cpp, fields_damage_test.cpp): a schema of every
// field kind, deterministic values per sample, and a check that an archive reads them back.
#pragma once

#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "shardfeed/format/archive.h"
#include "shardfeed/format/fields.h"
#include "test_util.h"

namespace shardfeed::format::testing_fields {

// Every kind of field the issue names, in a user's object form (declaration order kept).
inline constexpr const char* kAllTypes = R"({
  "image": "image", "label": "int64", "path": "str", "score": "float32", "weight": "float64",
  "count": "int64", "boxes": "boxes", "box_labels": {"type": "int64[*]", "per": "boxes"},
  "mask": "mask", "blob": "bytes", "meta": "json", "emb": "float32[512]", "tags": "int64[*]",
  "patch": "uint8[*,*,3]", "half": "float16[2,3]", "ids": "int32[3]"})";

inline Schema AllTypes() {
  auto s = Schema::FromJson(kAllTypes);
  REQUIRE(s.ok());
  return *s;
}

inline IndexEntry EntryFor(uint64_t i) {
  IndexEntry e{};
  e.label = static_cast<int32_t>(i % 3);
  e.height = static_cast<uint16_t>(10 + i % 5);
  e.width = static_cast<uint16_t>(20 + i % 7);
  e.channels = 3;
  e.encoding = static_cast<uint8_t>(Encoding::kJpeg);  // payloads are not decoded here
  e.orientation = 1;
  return e;
}

inline std::vector<uint8_t> Payload(uint64_t i) {
  std::mt19937 rng(static_cast<uint32_t>(i * 7919 + 1));
  std::vector<uint8_t> p(1 + rng() % 700);
  for (auto& b : p) b = static_cast<uint8_t>(rng());
  return p;
}

// One sample's values, owning their bytes.
struct Sample {
  std::vector<std::vector<uint8_t>> bytes;
  std::vector<std::vector<uint32_t>> dims;
  FieldValues Values() const {
    FieldValues v(bytes.size());
    for (size_t f = 0; f < bytes.size(); ++f) {
      v[f].data = bytes[f].data();
      v[f].size = bytes[f].size();
      v[f].ndim = static_cast<uint32_t>(dims[f].size());
      for (size_t d = 0; d < dims[f].size(); ++d) v[f].dims[d] = dims[f][d];
      v[f].present = true;
    }
    return v;
  }
};

template <typename T>
std::vector<uint8_t> Bytes(const std::vector<T>& v) {
  std::vector<uint8_t> out(v.size() * sizeof(T));
  if (!v.empty()) std::memcpy(out.data(), v.data(), out.size());
  return out;
}
inline std::vector<uint8_t> Text(const std::string& s) { return {s.begin(), s.end()}; }

// Deterministic values of sample i for `schema` (every field kind of AllTypes()).
inline Sample MakeSample(const Schema& schema, uint64_t i) {
  std::mt19937 rng(static_cast<uint32_t>(i * 31 + 7));
  const IndexEntry e = EntryFor(i);
  Sample s;
  s.bytes.resize(schema.size());
  s.dims.resize(schema.size());
  const uint32_t boxes = static_cast<uint32_t>(i % 4);
  for (size_t f = 0; f < schema.size(); ++f) {
    const FieldSpec& spec = schema.fields()[f];
    auto& b = s.bytes[f];
    auto& d = s.dims[f];
    switch (spec.kind) {
      case FieldKind::kImage:
        break;
      case FieldKind::kInt64:
        b = Bytes(std::vector<int64_t>{int64_t(i) * 1000003 - 5000000000LL + int64_t(f)});
        break;
      case FieldKind::kFloat32:
        b = Bytes(std::vector<float>{float(i) * 0.37f - 1.5f});
        break;
      case FieldKind::kFloat64:
        b = Bytes(std::vector<double>{double(i) / 3.0 + 1e-300});
        break;
      case FieldKind::kStr:
        b = Text(spec.name + "/sample-" + std::to_string(i) + "-\xc3\xa9\xe2\x82\xac");
        break;
      case FieldKind::kBytes:
        b.resize(i % 13);  // including empty
        for (auto& x : b) x = static_cast<uint8_t>(rng());
        break;
      case FieldKind::kJson:
        b = Text("{\"i\": " + std::to_string(i) + ", \"tags\": [\"a\", null, 1.5]}");
        break;
      case FieldKind::kBoxes: {
        std::vector<float> v;
        for (uint32_t k = 0; k < boxes; ++k) {  // valid boxes: x0 <= x1, y0 <= y1
          float c[4];
          for (float& x : c) x = float(rng() % 1000) / 7.0f;
          v.insert(v.end(), {std::min(c[0], c[2]), std::min(c[1], c[3]), std::max(c[0], c[2]),
                             std::max(c[1], c[3])});
        }
        b = Bytes(v);
        d = {boxes, 4};
        break;
      }
      case FieldKind::kMask:
        b.resize(size_t{e.height} * e.width);
        for (size_t k = 0; k < b.size(); ++k) b[k] = static_cast<uint8_t>((k / 7 + i) % 3);
        d = {e.height, e.width};
        break;
      case FieldKind::kArray: {
        uint64_t n = 1;
        for (size_t k = 0; k < spec.dims.size(); ++k) {
          uint32_t dim = spec.dims[k] != kAnyDim       ? uint32_t(spec.dims[k])
                         : !spec.per.empty() && k == 0 ? boxes
                                                       : uint32_t(1 + (i + k) % 4);
          d.push_back(dim);
          n *= dim;
        }
        b.resize(n * ElemSize(spec.elem));
        for (auto& x : b) x = static_cast<uint8_t>(rng());
        break;
      }
    }
  }
  return s;
}

inline Manifest ThreeClasses() {
  Manifest m;
  m.encoding = Encoding::kJpeg;
  m.class_names = {"a", "b", "c"};
  return m;
}

inline void WriteFields(const std::string& path, const Schema& schema, uint64_t n,
                        WriterOptions opt) {
  opt.schema = schema;
  auto w = ArchiveWriter::Create(path, opt);
  REQUIRE(w.ok());
  for (uint64_t i = 0; i < n; ++i) {
    const auto p = Payload(i);
    const Sample s = MakeSample(schema, i);
    Status st = (*w)->Append(EntryFor(i), p.data(), p.size(), s.Values());
    INFO(st.ToString());
    REQUIRE(st.ok());
  }
  REQUIRE((*w)->Finish(ThreeClasses()).ok());
}

// Every field of every sample reads back bit-exact, with its dims.
inline void CheckFields(const Archive& a, const Schema& schema, uint64_t n) {
  REQUIRE(a.size() == n);
  REQUIRE(a.schema() == schema);
  for (uint64_t i = 0; i < n; ++i) {
    const Sample want = MakeSample(schema, i);
    auto r = a.At(i);
    REQUIRE(r.ok());
    CHECK(r->entry->label == EntryFor(i).label);
    const auto p = Payload(i);
    REQUIRE(r->size == p.size());
    CHECK(std::memcmp(r->data, p.data(), p.size()) == 0);
    REQUIRE(a.VerifyRecord(i).ok());
    for (size_t f = 0; f < schema.size(); ++f) {
      const FieldSpec& spec = schema.fields()[f];
      if (int(f) == schema.image_field() || int(f) == schema.label_field()) continue;
      INFO("sample " << i << " field " << spec.name);
      auto v = a.Field(i, f, /*verify=*/true);
      INFO(v.status().ToString());
      REQUIRE(v.ok());
      if (spec.kind == FieldKind::kMask) {
        REQUIRE(v->ndim == 2);
        std::vector<uint8_t> pixels(size_t{v->dims[0]} * v->dims[1]);
        REQUIRE(DecodeMask(*v, pixels.data()).ok());
        CHECK(pixels == want.bytes[f]);
      } else {
        REQUIRE(v->size == want.bytes[f].size());
        CHECK((v->size == 0 || std::memcmp(v->data, want.bytes[f].data(), v->size) == 0));
      }
      std::vector<uint32_t> dims(v->dims.begin(), v->dims.begin() + v->ndim);
      if (spec.fixed()) {
        std::vector<uint32_t> spec_dims(spec.dims.begin(), spec.dims.end());
        CHECK(dims == spec_dims);
      } else {
        CHECK(dims == want.dims[f]);
      }
    }
  }
}

}  // namespace shardfeed::format::testing_fields
