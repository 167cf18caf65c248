// libFuzzer target: shard open + validation + record access + decode, for one backend
// (FUZZ_SHARD_FILE names the shard file the input's bytes become). Input: a little-endian u32
// manifest length, the manifest text, then the shard file's bytes. Seeds: scripts/fuzz.sh makes
// them from the golden archives (tests/fuzz/corpus/archive_*).
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "shardfeed/format/archive.h"
#include "shardfeed/reader/transform.h"

namespace {

const std::string& WorkDir() {
  static const std::string dir = [] {
    std::string d =
        std::filesystem::temp_directory_path() / ("shardfeed-fuzz-" + std::to_string(::getpid()));
    std::filesystem::create_directories(d);
    return d;
  }();
  return dir;
}

void Write(const std::string& path, const uint8_t* data, size_t size) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace shardfeed;
  if (size < 4) return 0;
  uint32_t manifest_size;
  std::memcpy(&manifest_size, data, 4);
  if (manifest_size > size - 4) return 0;
  const std::string& dir = WorkDir();
  Write(dir + "/manifest.json", data + 4, manifest_size);
  Write(dir + "/" FUZZ_SHARD_FILE, data + 4 + manifest_size, size - 4 - manifest_size);
  auto archive = format::Archive::Open(dir);
  if (!archive.ok()) return 0;
  const format::Archive& a = **archive;
  for (size_t s = 0; s < a.manifest().shards.size(); ++s) (void)a.VerifyShard(s);
  reader::TransformOptions t;
  t.size = 16;
  t.crop = reader::Crop::kRandom;
  t.max_pixels = uint64_t{4} << 20;  // keep each input fast; the limit logic is what is tested
  reader::SampleDecoder decoder(*archive, t);
  std::vector<uint8_t> out(decoder.sample_bytes());
  for (uint64_t i = 0; i < a.size() && i < 64; ++i) {
    reader::StageTimes times;
    (void)a.VerifyRecord(i);
    (void)decoder.DecodeInto(i, i, out.data(), &times);
  }
  return 0;
}
