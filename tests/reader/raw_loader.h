// The loader tests' common ground: a small raw archive (constant_archive.h: sample i's pixels
// are i % 251, label i % 5), options that copy its records unchanged, and an epoch reader that
// checks every sample's pixels and label against its index.
#pragma once

#include <catch.hpp>
#include <memory>
#include <string>
#include <vector>

#include "constant_archive.h"
#include "shardfeed/reader/loader.h"

namespace shardfeed::reader {

inline constexpr uint32_t kSide = 6;

inline std::shared_ptr<format::Archive> MakeRawArchive(const std::string& path, uint64_t n) {
  return testing::MakeConstantArchive(path, n, kSide);
}

inline LoaderOptions CopyOptions(uint32_t batch, int workers) {
  LoaderOptions o;
  o.batch_size = batch;
  o.workers = workers;
  o.prefetch = 3;
  o.transform.crop = Crop::kNone;
  o.transform.size = 0;
  return o;
}

struct Delivered {
  std::vector<uint64_t> indices;
  std::vector<uint32_t> batch_sizes;
};

// Reads one epoch, checking each sample's pixels and label against its index.
inline Delivered ReadEpoch(Loader& loader, uint64_t epoch, uint64_t start = 0) {
  Delivered d;
  REQUIRE(loader.StartEpoch(epoch, start).ok());
  for (;;) {
    auto b = loader.Next();
    REQUIRE(b.ok());
    if (!*b) break;
    d.batch_sizes.push_back(b->size());
    const size_t per = b->image_bytes() / b->size();
    for (uint32_t j = 0; j < b->size(); ++j) {
      uint64_t idx = b->indices()[j];
      d.indices.push_back(idx);
      REQUIRE(b->labels()[j] == static_cast<int64_t>(idx % 5));
      const uint8_t* img = b->images() + j * per;
      REQUIRE(img[0] == idx % 251);
      REQUIRE(img[per - 1] == idx % 251);
    }
  }
  return d;
}

}  // namespace shardfeed::reader
