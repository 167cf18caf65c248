// The importers' source lists (schema, values, errors) and the SampleWriter's checks; the
// archives they write are read back by tests/cli/test_importers.py.
#include <cstring>
#include <filesystem>
#include <fstream>

#include "shardfeed/converter/importers.h"
#include "shardfeed/converter/sample_writer.h"
#include "test_util.h"

namespace shardfeed::converter {
namespace {

using testing::SampleDir;
using testing::TempDir;
namespace fs = std::filesystem;

void Write(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
}

// A JPEG of the sample data (the cat class's first file).
std::string SomeImage() {
  for (const auto& e : fs::directory_iterator(SampleDir() + "/cat")) {
    if (e.path().extension() == ".jpg") return e.path().string();
  }
  return "";
}

template <typename T>
std::vector<T> Elements(const OwnedValue& v) {
  std::vector<T> out(v.bytes.size() / sizeof(T));
  std::memcpy(out.data(), v.bytes.data(), v.bytes.size());
  return out;
}

std::string Str(const OwnedValue& v) { return std::string(v.bytes.begin(), v.bytes.end()); }

TEST_CASE("a JSONL manifest's schema is inferred from its values") {
  TempDir dir;
  const std::string img = SomeImage();
  Write(dir / "d.jsonl",
        "{\"file_name\": \"" + img +
            "\", \"caption\": \"a cat\", \"label\": 1, \"score\": 0.5, \"tags\": [1, 2], "
            "\"emb\": [0.5, 1], \"boxes\": [[1, 2, 3, 4]], \"meta\": {\"k\": 1}, \"n\": 3}\n"
            "\n"
            "{\"file_name\": \"" +
            img +
            "\", \"caption\": \"b\", \"label\": 0, \"score\": 2, \"tags\": [], \"emb\": [1.5, 2], "
            "\"boxes\": [], \"meta\": [1], \"n\": 4}\n");
  auto list = ImportJsonl(dir / "d.jsonl", {});
  INFO(list.status().ToString());
  REQUIRE(list.ok());
  CHECK(list->schema.ToJson() ==
        format::Schema::FromJson(
            R"({"image": "image", "caption": "str", "label": "int64", "score": "float64",
                "tags": "int64[*]", "emb": "float32[*]", "boxes": "boxes", "meta": "json",
                "n": "int64", "path": "str"})")
            ->ToJson());
  REQUIRE(list->items.size() == 2);
  CHECK(list->class_names == std::vector<std::string>{"0", "1"});
  CHECK(list->path_field);
  const auto& a = list->items[0];
  CHECK(a.name == (dir / "d.jsonl") + ":1");
  CHECK(a.label == 1);
  CHECK(Str(a.values[1]) == "a cat");
  CHECK(Elements<double>(a.values[3]) == std::vector<double>{0.5});
  CHECK(Elements<int64_t>(a.values[4]) == std::vector<int64_t>{1, 2});
  CHECK(Elements<float>(a.values[5]) == std::vector<float>{0.5f, 1.0f});
  CHECK(Elements<float>(a.values[6]) == std::vector<float>{1, 2, 3, 4});
  CHECK(a.values[6].ndim == 2);
  CHECK(Str(a.values[7]) == "{\"k\":1}");
  const auto& b = list->items[1];
  CHECK(b.name == (dir / "d.jsonl") + ":3");  // the blank line counts
  CHECK(b.values[6].ndim == 2);
  CHECK(b.values[6].dims[0] == 0);
  CHECK(b.values[6].dims[1] == 4);
  CHECK(Elements<double>(b.values[3]) == std::vector<double>{2.0});  // an int in a float column
}

TEST_CASE("a bad row names the file, the line and the field; skip_bad lists it") {
  TempDir dir;
  const std::string img = SomeImage();
  Write(dir / "d.jsonl", "{\"image\": \"" + img + "\", \"n\": 1}\n{\"image\": \"" + img +
                             "\", \"n\": 2}\n{\"image\": \"" + img + "\", \"n\": 2.5}\n");
  ImportOptions o;
  o.schema_json = R"({"image": "image", "n": "int64"})";
  auto refused = ImportJsonl(dir / "d.jsonl", o);
  REQUIRE(!refused.ok());
  CHECK(refused.status().code() == StatusCode::kCorrupt);
  CHECK(refused.status().message().find("d.jsonl:3") != std::string::npos);
  CHECK(refused.status().message().find("field 'n'") != std::string::npos);
  o.skip_bad = true;
  auto skipped = ImportJsonl(dir / "d.jsonl", o);
  REQUIRE(skipped.ok());
  CHECK(skipped->items.size() == 2);
  REQUIRE(skipped->skipped.size() == 1);
  CHECK(skipped->skipped[0].path == (dir / "d.jsonl") + ":3");
  // Not JSON at all.
  Write(dir / "e.jsonl", "{\"image\": \"" + img + "\"}\n{oops\n");
  auto not_json = ImportJsonl(dir / "e.jsonl", {});
  CHECK(not_json.status().message().find("e.jsonl:2: not valid JSON") != std::string::npos);
}

TEST_CASE("--schema overrides the inferred types") {
  TempDir dir;
  const std::string img = SomeImage();
  Write(dir / "d.jsonl", "{\"image\": \"" + img + "\", \"emb\": [1, 2, 3], \"id\": 7}\n");
  ImportOptions o;
  o.schema_json = R"({"image": "image", "emb": "float16[3]", "id": "float32"})";
  auto list = ImportJsonl(dir / "d.jsonl", o);
  INFO(list.status().ToString());
  REQUIRE(list.ok());
  CHECK(list->schema.ToJson() == format::Schema::FromJson(o.schema_json)->ToJson());
  CHECK(!list->path_field);
  CHECK(Elements<uint16_t>(list->items[0].values[1]) ==
        std::vector<uint16_t>{0x3c00, 0x4000, 0x4200});  // 1, 2, 3 as IEEE halves
  CHECK(Elements<float>(list->items[0].values[2]) == std::vector<float>{7.0f});
}

TEST_CASE("a CSV manifest: quoted cells, typed columns, class names from strings") {
  TempDir dir;
  const std::string img = SomeImage();
  Write(dir / "d.csv", "path,caption,label,w,boxes\n" + img +
                           ",\"hello, \"\"world\"\"\nsecond line\",dog,1.5,\"[[0,0,5,5]]\"\n" +
                           img + ",plain,cat,2,[]\r\n");
  auto list = ImportCsv(dir / "d.csv", {});
  INFO(list.status().ToString());
  REQUIRE(list.ok());
  CHECK(list->schema.ToJson() ==
        format::Schema::FromJson(
            R"({"image": "image", "caption": "str", "label": "int64", "w": "float64",
                "boxes": "boxes", "path": "str"})")
            ->ToJson());
  CHECK(list->class_names == std::vector<std::string>{"cat", "dog"});
  REQUIRE(list->items.size() == 2);
  CHECK(Str(list->items[0].values[1]) == "hello, \"world\"\nsecond line");
  CHECK(list->items[0].label == 1);
  CHECK(list->items[1].label == 0);
  CHECK(list->items[1].name == (dir / "d.csv") + ":4");  // the quoted line break counts
  CHECK(Elements<float>(list->items[0].values[4]) == std::vector<float>{0, 0, 5, 5});
  Write(dir / "bad.csv", "image,n\n" + img + ",1\n" + img + ",x\n");
  ImportOptions o;
  o.schema_json = R"({"image": "image", "n": "int64"})";
  auto refused = ImportCsv(dir / "bad.csv", o);
  CHECK(refused.status().message().find("bad.csv:3: field 'n'") != std::string::npos);
  Write(dir / "twice.csv", "image,n,n\n" + img + ",1,2\n");
  auto twice = ImportCsv(dir / "twice.csv", {});
  CHECK(twice.status().message().find("twice.csv:1: column 'n' given twice") != std::string::npos);
}

TEST_CASE("a COCO file: xywh boxes, contiguous labels, iscrowd, captions, empty images") {
  TempDir dir;
  const std::string img = SomeImage();
  Write(dir / "instances.json", R"({"images": [{"id": 10, "file_name": ")" + img +
                                    R"("}, {"id": 11, "file_name": ")" + img + R"("}],
      "categories": [{"id": 90, "name": "zebra"}, {"id": 3, "name": "car"}],
      "annotations": [
        {"id": 1, "image_id": 10, "category_id": 90, "bbox": [1, 2, 10, 20], "iscrowd": 0},
        {"id": 2, "image_id": 10, "category_id": 3, "bbox": [0.5, 0, 1, 1], "iscrowd": 1}]})");
  Write(dir / "captions.json", R"({"annotations": [{"image_id": 11, "caption": "two"},
      {"image_id": 11, "caption": "three"}]})");
  ImportOptions o;
  o.images = dir.path();
  o.captions = dir / "captions.json";
  auto list = ImportCoco(dir / "instances.json", o);
  INFO(list.status().ToString());
  REQUIRE(list.ok());
  CHECK(list->class_names == std::vector<std::string>{"car", "zebra"});
  REQUIRE(list->items.size() == 2);
  const auto& a = list->items[0];
  CHECK(Elements<float>(a.values[1]) == std::vector<float>{1, 2, 11, 22, 0.5f, 0, 1.5f, 1});
  CHECK(Elements<int64_t>(a.values[2]) == std::vector<int64_t>{1, 0});
  CHECK(Elements<int64_t>(a.values[3]) == std::vector<int64_t>{0, 1});
  CHECK(Elements<int64_t>(a.values[4]) == std::vector<int64_t>{90, 3});  // the file's ids
  CHECK(Elements<int64_t>(a.values[5]) == std::vector<int64_t>{10});
  CHECK(Str(a.values[7]) == "[]");
  const auto& b = list->items[1];
  CHECK(b.values[1].dims[0] == 0);  // kept, with no boxes
  CHECK(Str(b.values[7]) == R"(["two","three"])");
  // A box without a known category: the file, the annotation and the field.
  Write(dir / "bad.json", R"({"images": [{"id": 1, "file_name": "a.jpg"}],
      "categories": [{"id": 1, "name": "a"}],
      "annotations": [{"image_id": 1, "category_id": 2, "bbox": [0, 0, 1, 1]}]})");
  o.captions.clear();
  auto refused = ImportCoco(dir / "bad.json", o);
  CHECK(refused.status().message().find("annotations[0]: field 'labels'") != std::string::npos);
}

TEST_CASE("an MXNet list with several labels per line keeps them all") {
  TempDir dir;
  const std::string img = SomeImage();
  Write(dir / "multi.lst", "0\t1\t" + img + "\n1\t2\t0\t5\t" + img + "\n");
  auto list = ReadListFile(dir / "multi.lst", dir.path());
  REQUIRE(list.ok());
  CHECK(list->schema.ToJson() ==
        format::Schema::FromJson(R"({"image": "image", "labels": "int64[*]", "path": "str"})")
            ->ToJson());
  CHECK(list->class_names.empty());
  CHECK(Elements<int64_t>(list->items[0].values[1]) == std::vector<int64_t>{1});
  CHECK(Elements<int64_t>(list->items[1].values[1]) == std::vector<int64_t>{2, 0, 5});
  Write(dir / "single.lst", "0\t1\t" + img + "\n1\t2\t" + img + "\n");
  auto single = ReadListFile(dir / "single.lst", dir.path());
  REQUIRE(single.ok());
  CHECK(single->schema.ToJson() == format::Schema::ImageFolder().ToJson());
  CHECK(single->items[1].label == 2);
}

TEST_CASE("the source kind is recognised from the path") {
  TempDir dir;
  Write(dir / "a.jsonl", "{}");
  Write(dir / "a.csv", "x");
  Write(dir / "coco.json", R"({"info": {}, "images": [], "annotations": []})");
  Write(dir / "other.json", R"({"x": 1})");
  fs::create_directories(dir / "shards");
  Write(dir / "shards/a-000.tar", "");
  CHECK(*DetectSourceKind(dir / "a.jsonl") == "jsonl");
  CHECK(*DetectSourceKind(dir / "a.csv") == "csv");
  CHECK(*DetectSourceKind(dir / "coco.json") == "coco");
  CHECK(*DetectSourceKind(dir / "shards") == "webdataset");
  CHECK(*DetectSourceKind(SampleDir()) == "folder");
  auto unknown = DetectSourceKind(dir / "other.json");
  CHECK(unknown.status().message().find("--from") != std::string::npos);
}

TEST_CASE("the sample writer names the sample and the field of a bad value") {
  TempDir dir;
  PackOptions o;
  o.workers = 2;
  o.writer.schema = *format::Schema::FromJson(
      R"({"image": "image", "boxes": "boxes", "labels": {"type": "int64[*]", "per": "boxes"}})");
  auto writer = SampleWriter::Create(dir / "out", o);
  REQUIRE(writer.ok());
  Sample s;
  s.name = "sample-7";
  s.height = 4, s.width = 5;
  s.image.assign(4 * 5 * 3, 128);
  const float box[4] = {0, 0, 2, 2};
  const int64_t labels[2] = {1, 2};
  s.values.resize(3);
  s.values[1] = OwnedValue::Array(box, sizeof(box), {1, 4});
  s.values[2] = OwnedValue::Array(labels, sizeof(labels), {2});  // 2 rows for 1 box
  REQUIRE((*writer)->Write(std::move(s)).ok());
  Status st = (*writer)->Finish(format::Manifest());
  CHECK(st.code() == StatusCode::kInvalidArgument);
  CHECK(st.message().find("sample-7") != std::string::npos);
  CHECK(st.message().find("field 'labels'") != std::string::npos);
  CHECK((*writer)->result().failed_sample == "sample-7");
  CHECK(!fs::exists(dir / "out"));
}

TEST_CASE("pixels are stored losslessly; a bad image is skipped and listed") {
  TempDir dir;
  PackOptions o;
  o.workers = 3;
  o.writer.schema = format::Schema::Legacy();
  auto writer = SampleWriter::Create(dir / "out", o);
  REQUIRE(writer.ok());
  for (int i = 0; i < 40; ++i) {
    Sample s;
    s.name = "s" + std::to_string(i);
    s.label = i % 3;
    if (i == 5) {
      s.image.assign(10, 0);  // not an image
    } else {
      s.height = 3, s.width = 2;
      s.image.resize(18);
      for (size_t k = 0; k < 18; ++k) s.image[k] = static_cast<uint8_t>(i * 7 + k);
    }
    REQUIRE((*writer)->Write(std::move(s)).ok());
  }
  format::Manifest m;
  m.class_names = {"a", "b", "c"};
  Status st = (*writer)->Finish(m);
  INFO(st.ToString());
  REQUIRE(st.ok());
  REQUIRE((*writer)->result().skipped.size() == 1);
  CHECK((*writer)->result().skipped[0].path == "s5");
  auto a = format::Archive::Open(dir / "out");
  REQUIRE(a.ok());
  REQUIRE((*a)->size() == 39);
  auto codec = codec::CodecFor(format::Encoding::kZstd);
  codec::Context ctx;
  for (uint64_t i = 0; i < 39; ++i) {
    const int src = i < 5 ? int(i) : int(i) + 1;
    auto r = (*a)->At(i).ValueOrDie();
    CHECK(r.entry->label == src % 3);
    imaging::Image img;
    REQUIRE((*codec)->Decode(ctx, r, {}, true, &img).ok());
    REQUIRE(img.pixels.size() == 18);
    for (size_t k = 0; k < 18; ++k) CHECK(img.pixels[k] == static_cast<uint8_t>(src * 7 + k));
  }
}

TEST_CASE(
    "a sample writer destroyed without Finish leaves nothing; OUT is replaced only with "
    "overwrite") {
  TempDir dir;
  PackOptions o;
  o.workers = 2;
  o.writer.schema = *format::Schema::FromJson(R"({"image": "image", "caption": "str"})");
  auto sample = [](int i) {
    Sample s;
    s.name = "s" + std::to_string(i);
    s.image_file = SomeImage();
    s.values.resize(2);
    s.values[1] = OwnedValue::Text("caption " + std::to_string(i));
    return s;
  };
  {
    auto writer = SampleWriter::Create(dir / "out", o);
    REQUIRE(writer.ok());
    for (int i = 0; i < 50; ++i) REQUIRE((*writer)->Write(sample(i)).ok());
  }  // no Finish
  CHECK(!fs::exists(dir / "out"));
  CHECK(!fs::exists(dir / "out.partial"));
  {
    auto writer = SampleWriter::Create(dir / "out", o);
    REQUIRE(writer.ok());
    for (int i = 0; i < 3; ++i) REQUIRE((*writer)->Write(sample(i)).ok());
    REQUIRE((*writer)->Finish(format::Manifest()).ok());
  }
  auto again = SampleWriter::Create(dir / "out", o);
  CHECK(!again.ok());  // exists, no overwrite
  o.writer.overwrite = true;
  auto writer = SampleWriter::Create(dir / "out", o);
  REQUIRE(writer.ok());
  for (int i = 0; i < 5; ++i) REQUIRE((*writer)->Write(sample(i)).ok());
  REQUIRE((*writer)->Finish(format::Manifest()).ok());
  auto a = format::Archive::Open(dir / "out");
  REQUIRE(a.ok());
  REQUIRE((*a)->size() == 5);
  for (uint64_t i = 0; i < 5; ++i) {
    auto v = (*a)->Field(i, 1, true);
    REQUIRE(v.ok());
    CHECK(std::string(reinterpret_cast<const char*>(v->data), v->size) ==
          "caption " + std::to_string(i));
  }
}

}  // namespace
}  // namespace shardfeed::converter
