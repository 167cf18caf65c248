// The tools on an archive with typed fields (format version 4): inspect lists the schema and
// each field's bytes, verify --decode checks every field, extract writes the source layout back
// with samples.jsonl and schema.json, the contact sheet draws boxes and masks.
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "shardfeed/format/archive.h"
#include "shardfeed/imaging/image.h"
#include "shardfeed/validate/extract.h"
#include "shardfeed/validate/inspect.h"
#include "shardfeed/validate/verify.h"
#include "test_util.h"

namespace shardfeed::validate {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::TempDir;

constexpr uint32_t kW = 40, kH = 30;

const char* kSchema = R"({"image": "image", "label": "int64", "boxes": "boxes",
  "box_labels": {"type": "int64[*]", "per": "boxes"}, "mask": "mask", "caption": "str",
  "meta": "json", "emb": "float32[3]", "blob": "bytes", "path": "str"})";

// Sample i: a dark image with a bright rectangle [x0, x1) x [y0, y1); its box, its mask.
struct Sample {
  std::vector<uint8_t> pixels;
  std::vector<float> boxes;
  std::vector<int64_t> box_labels;
  std::vector<uint8_t> mask;
  std::string caption, meta, path;
  float emb[3];
  std::vector<uint8_t> blob;
};

Sample MakeSample(int i) {
  Sample s;
  const uint32_t x0 = 4 + i, y0 = 3 + i, x1 = 20 + 2 * i, y1 = 18 + i;
  s.pixels.assign(size_t{kW} * kH * 3, 10);
  s.mask.assign(size_t{kW} * kH, 0);
  for (uint32_t y = y0; y < y1; ++y) {
    for (uint32_t x = x0; x < x1; ++x) {
      std::memset(&s.pixels[(size_t{y} * kW + x) * 3], 240, 3);
      s.mask[size_t{y} * kW + x] = 1;
    }
  }
  s.boxes = {float(x0), float(y0), float(x1), float(y1)};
  s.box_labels = {i};
  if (i == 1) {  // two boxes, the second inside the first
    s.boxes.insert(s.boxes.end(), {float(x0 + 1), float(y0 + 1), float(x0 + 3), float(y0 + 3)});
    s.box_labels.push_back(7);
  }
  s.caption = "a bright rectangle number " + std::to_string(i);
  s.meta = R"({"i": )" + std::to_string(i) + R"(, "tags": ["x", "y"]})";
  s.path = "cls" + std::to_string(i % 2) + "/img" + std::to_string(i) + ".png";
  s.emb[0] = 0.5f * i, s.emb[1] = -1.25f, s.emb[2] = 3.0f;
  s.blob = {0, 1, 2, uint8_t(i), 255};
  return s;
}

// `first_box`: when given, sample 0's one box (a crafted one, say).
std::shared_ptr<format::Archive> WriteArchive(const std::string& path, int n,
                                              const std::vector<float>& first_box = {}) {
  auto schema = format::Schema::FromJson(kSchema);
  REQUIRE(schema.ok());
  format::WriterOptions wo;
  wo.encoding = format::Encoding::kRaw;
  wo.schema = *schema;
  auto w = format::ArchiveWriter::Create(path, wo);
  REQUIRE(w.ok());
  for (int i = 0; i < n; ++i) {
    Sample s = MakeSample(i);
    if (i == 0 && !first_box.empty()) s.boxes = first_box;
    format::IndexEntry e{};
    e.label = i % 2;
    e.height = kH, e.width = kW, e.channels = 3, e.orientation = 1;
    e.encoding = static_cast<uint8_t>(format::Encoding::kRaw);
    format::FieldValues v(schema->size());
    auto set = [&](const char* name, const void* data, size_t size,
                   std::initializer_list<uint32_t> dims) {
      format::FieldValue& f = v[schema->Find(name)];
      f.data = data, f.size = size, f.present = true;
      for (uint32_t d : dims) f.dims[f.ndim++] = d;
    };
    const uint32_t rows = static_cast<uint32_t>(s.box_labels.size());
    set("boxes", s.boxes.data(), s.boxes.size() * 4, {rows, 4});
    set("box_labels", s.box_labels.data(), s.box_labels.size() * 8, {rows});
    set("mask", s.mask.data(), s.mask.size(), {kH, kW});
    set("caption", s.caption.data(), s.caption.size(), {});
    set("meta", s.meta.data(), s.meta.size(), {});
    set("emb", s.emb, sizeof s.emb, {3});
    set("blob", s.blob.data(), s.blob.size(), {});
    set("path", s.path.data(), s.path.size(), {});
    REQUIRE((*w)->Append(e, s.pixels.data(), s.pixels.size(), v).ok());
  }
  format::Manifest m;
  m.encoding = format::Encoding::kRaw;
  m.class_names = {"even", "odd"};
  REQUIRE((*w)->Finish(m).ok());
  auto archive = format::Archive::Open(path);
  REQUIRE(archive.ok());
  return *archive;
}

std::string ReadText(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

TEST_CASE("inspect lists every field with its stored bytes", "[fields]") {
  TempDir dir;
  auto archive = WriteArchive(dir.path() + "/a", 3);
  const json j = json::parse(InspectJson(*archive));
  REQUIRE(j["fields"].size() == 10);
  std::map<std::string, json> by_name;
  for (const auto& f : j["fields"]) by_name[f["name"]] = f;
  CHECK(by_name["image"]["stored"] == "records");
  CHECK(by_name["image"]["bytes"] == 3 * kW * kH * 3);
  CHECK(by_name["label"]["stored"] == "index");
  CHECK(by_name["emb"]["stored"] == "column");
  CHECK(by_name["emb"]["bytes"] == 3 * 12);
  CHECK(by_name["boxes"]["stored"] == "blob");
  CHECK(by_name["boxes"]["rows"] == 4);  // 1 + 2 + 1
  CHECK(by_name["box_labels"]["per"] == "boxes");
  CHECK(by_name["box_labels"]["type"] == "int64[*]");
  const std::string text = InspectText(*archive);
  CHECK(text.find("box_labels") != std::string::npos);
  CHECK(text.find("int64[*] per boxes") != std::string::npos);
}

TEST_CASE("verify --decode checks every field of every sample", "[fields]") {
  TempDir dir;
  auto archive = WriteArchive(dir.path() + "/a", 4);
  VerifyOptions o;
  o.decode = true;
  const VerifyReport r = Verify(*archive, o);
  INFO(r.ToJson());
  CHECK(r.ok());
  CHECK(r.checked == 4);
}

TEST_CASE("extract writes the source layout, samples.jsonl and schema.json", "[fields]") {
  TempDir dir;
  auto archive = WriteArchive(dir.path() + "/a", 3);
  const std::string out = dir.path() + "/out";
  auto n = Extract(*archive, out);
  REQUIRE(n.ok());
  CHECK(*n == 3);
  // The path field places each image; raw records come back as PNG with the same pixels.
  for (int i = 0; i < 3; ++i) {
    const Sample s = MakeSample(i);
    const fs::path img = fs::path(out) / s.path;
    REQUIRE(fs::exists(img));
    const std::string bytes = ReadText(img);
    imaging::Decoder dec;
    imaging::Image decoded;
    REQUIRE(dec.Decode(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), &decoded,
                       imaging::Limits())
                .ok());
    CHECK(std::vector<uint8_t>(decoded.pixels.begin(), decoded.pixels.end()) == s.pixels);
  }
  const json schema = json::parse(ReadText(fs::path(out) / "schema.json"));
  CHECK(schema["box_labels"]["per"] == "boxes");
  CHECK(schema["emb"] == "float32[3]");
  std::ifstream lines(fs::path(out) / "samples.jsonl");
  std::string line;
  int i = 0;
  while (std::getline(lines, line)) {
    const Sample s = MakeSample(i);
    const json j = json::parse(line);
    CHECK(j["image"] == s.path);
    CHECK(j["label"] == i % 2);
    CHECK(j["caption"] == s.caption);
    CHECK(j["meta"] == json::parse(s.meta));
    CHECK(j["path"] == s.path);
    CHECK(j["emb"] == json::array({s.emb[0], s.emb[1], s.emb[2]}));
    CHECK(j["box_labels"] == json(s.box_labels));
    REQUIRE(j["boxes"].size() == s.box_labels.size());
    for (size_t b = 0; b < s.box_labels.size(); ++b) {
      for (int k = 0; k < 4; ++k) CHECK(j["boxes"][b][k] == s.boxes[4 * b + k]);
    }
    CHECK(j["blob"]["base64"] == (i == 0 ? "AAECAP8=" : i == 1 ? "AAECAf8=" : "AAECAv8="));
    // The mask as a grayscale PNG holding exactly the mask's values.
    const std::string png = ReadText(fs::path(out) / j["mask"].get<std::string>());
    imaging::Decoder dec;
    imaging::Image decoded;
    REQUIRE(dec.Decode(reinterpret_cast<const uint8_t*>(png.data()), png.size(), &decoded,
                       imaging::Limits())
                .ok());
    REQUIRE(decoded.width == kW);
    REQUIRE(decoded.height == kH);
    for (size_t p = 0; p < s.mask.size(); ++p) {
      if (decoded.pixels[3 * p] != s.mask[p]) FAIL("mask pixel " << p << " of sample " << i);
    }
    ++i;
  }
  CHECK(i == 3);
}

TEST_CASE("the contact sheet draws each sample's boxes over its thumbnail", "[fields]") {
  TempDir dir;
  auto archive = WriteArchive(dir.path() + "/a", 2);
  ContactSheetOptions o;
  o.per_class = 1;
  o.tile = 80;
  auto sheet = ContactSheet(*archive, o);
  REQUIRE(sheet.ok());
  // The first box's outline colour (255, 40, 40) appears; a sheet without overlays has none.
  size_t red = 0;
  for (size_t p = 0; p + 2 < sheet->pixels.size(); p += 3) {
    red += sheet->pixels[p] == 255 && sheet->pixels[p + 1] == 40 && sheet->pixels[p + 2] == 40;
  }
  CHECK(red > 40);
}

TEST_CASE("the contact sheet draws a box far outside the image at once", "[fields]") {
  // REGRESSION: an edge was drawn pixel by pixel to its coordinate: a box [1, 1, 1e15, 6] (the
  // writers take it) spun for hours. Edges are now clamped to the tile; a crafted NaN or inf
  // coordinate (the writers refuse them) is not drawn.
  for (const std::vector<float>& box :
       {std::vector<float>{1, 1, 1e15f, 6}, std::vector<float>{-1e29f, -1e29f, 1e29f, 1e29f}}) {
    TempDir dir;
    auto archive = WriteArchive(dir.path() + "/a", 2, box);
    ContactSheetOptions o;
    o.per_class = 1;
    o.tile = 80;
    auto sheet = ContactSheet(*archive, o);
    REQUIRE(sheet.ok());
  }
}

}  // namespace
}  // namespace shardfeed::validate
