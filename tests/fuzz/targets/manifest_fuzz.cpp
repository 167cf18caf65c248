// libFuzzer target: manifest parsing. Whatever parses must write back and parse again to the
// same manifest (ToJson/FromJson are inverses on everything FromJson accepts).
#include <cstdint>
#include <cstdlib>
#include <string>

#include "shardfeed/format/manifest.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace shardfeed::format;
  const std::string text(reinterpret_cast<const char*>(data), size);
  (void)IsShardfeedManifest(text);
  auto m = Manifest::FromJson(text, "fuzz");
  if (!m.ok()) return 0;
  auto again = Manifest::FromJson(m->ToJson(), "fuzz (rewritten)");
  if (!again.ok() || again->sample_count != m->sample_count ||
      again->class_names != m->class_names || again->shards.size() != m->shards.size()) {
    std::abort();  // a manifest we accept must survive a round trip
  }
  return 0;
}
