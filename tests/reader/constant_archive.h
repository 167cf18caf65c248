// A fixed-shape raw archive for reader tests: sample i has every pixel byte equal to i % 251
// (so any crop, resize or flip of it is too) and label i % 5, over 5 classes. With `shift`,
// (i + shift) % 251: another archive of the same shape and size.
#pragma once

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "shardfeed/format/archive.h"
#include "test_util.h"

namespace shardfeed::testing {

inline std::shared_ptr<format::Archive> MakeConstantArchive(
    const std::string& path, uint64_t n, uint32_t side,
    format::Backend backend = format::Backend::kLmdb, uint32_t shift = 0) {
  format::WriterOptions wo;
  wo.backend = backend;
  wo.encoding = format::Encoding::kRaw;
  wo.height = wo.width = side;
  auto w = format::ArchiveWriter::Create(path, wo);
  REQUIRE(w.ok());
  std::vector<uint8_t> px(size_t{side} * side * 3);
  for (uint64_t i = 0; i < n; ++i) {
    std::fill(px.begin(), px.end(), static_cast<uint8_t>((i + shift) % 251));
    format::IndexEntry e{};
    e.label = static_cast<int32_t>(i % 5);
    e.height = e.width = static_cast<uint16_t>(side);
    e.channels = 3;
    e.encoding = static_cast<uint8_t>(format::Encoding::kRaw);
    e.orientation = 1;
    REQUIRE((*w)->Append(e, px.data(), px.size()).ok());
  }
  format::Manifest m;
  m.encoding = format::Encoding::kRaw;
  m.class_names = {"a", "b", "c", "d", "e"};
  m.height = m.width = side;
  m.channels = 3;
  REQUIRE((*w)->Finish(m).ok());
  auto a = format::Archive::Open(path);
  REQUIRE(a.ok());
  return *a;
}

}  // namespace shardfeed::testing
