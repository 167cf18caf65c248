// Restart-indexed JPEGs: a JPEG rewritten losslessly so that its entropy-coded data can be
// entered at the start of any MCU row and of any restart segment within it, and the region
// decode that uses this to entropy-decode only the segments a crop overlaps.
//
// The re-layout keeps the DCT coefficients, quantisation tables, component ids and every APPn
// and COM segment (EXIF orientation, ICC, JFIF, Adobe) byte for byte, so a decode of the result
// gives exactly the pixels of a decode of the source. What changes: a single interleaved
// baseline Huffman scan (progressive and arithmetic-coded inputs become baseline), optimal
// Huffman tables, and a restart marker every `restart_interval` MCUs, where the interval divides
// the MCUs of a row (so each row starts a segment) and is at most kMaxRestartInterval.
//
// Thread-safety: free functions, no shared state. Errors: Status (kCorrupt for a malformed or
// truncated JPEG, kUnsupported for one libjpeg cannot transcode, kResourceExhausted over Limits).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "shardfeed/base/status.h"
#include "shardfeed/imaging/image.h"

namespace shardfeed::imaging {

// The restart interval: the largest divisor of a row's MCUs that is at most kMaxRestartInterval
// and leaves at least 4 segments a row; a row with no such divisor (a prime count, a narrow
// image) is one segment. Not 1: libjpeg-turbo's fast Huffman path gives up on the MCU before
// every marker, so a marker every MCU decodes slower than none (measured, docs/BENCHMARKS.md,
// "Region decode"), and costs 6-8% in size over optimal Huffman tables where 16 costs ~0.5%.
inline constexpr uint32_t kMaxRestartInterval = 16;

// Where a JPEG's scan can be entered: one offset per MCU row.
struct JpegRestartLayout {
  uint32_t mcus_per_row = 0, mcu_rows = 0;
  uint32_t restart_interval = 0;      // MCUs per segment; divides mcus_per_row
  std::vector<uint32_t> row_offsets;  // first entropy-coded byte of each MCU row, from SOI
  uint32_t scan_end = 0;              // offset of the marker that ends the scan (EOI)
};

// Rewrites the JPEG `data` as described above into `out` (a complete JPEG, SOI..EOI) and
// describes the result in `layout`.
Status RelayoutJpeg(const uint8_t* data, size_t size, const Limits& limits,
                    std::vector<uint8_t>* out, JpegRestartLayout* layout);

// Walks the headers and the whole scan of a re-laid JPEG and describes it: every restart marker
// must be where the interval puts it, numbered in sequence, and the scan must end in EOI.
// kCorrupt with the reason otherwise (verify --decode compares the result with the stored index).
Status ScanRestartLayout(const uint8_t* data, size_t size, JpegRestartLayout* layout);

// The stored index as a view: `row_offsets` points at `mcu_rows` little-endian uint32 (any
// alignment), e.g. inside a mapped record.
struct JpegRowIndex {
  const uint8_t* row_offsets = nullptr;
  uint32_t mcu_rows = 0;
  uint32_t restart_interval = 0;
  uint32_t scan_end = 0;
};

// Builds into `synth` a small JPEG holding just the MCUs that `region` (stored pixel coordinates)
// needs, widened to whole restart segments: at the scale n/8 DecodeJpegRegion picks for
// `region`, its pixels and, where that decode upsamples chroma across block edges in a
// direction, one more pixel on each side there (the neighbour the triangle filter reads).
// `*origin_x`/`*origin_y` receive the pixel position of the synthetic image's top-left corner
// in the source. DecodeJpegRegion of the synthetic image with the region moved by the origin and
// `exact` set equals the same crop of a whole decode of the source at that scale, bit for bit.
// Checks the index against the headers and every marker it passes; kCorrupt names what disagrees.
// False in
// `*worthwhile` (and `synth` untouched) when it would entropy-decode over 97% of the MCUs a
// decode of the stored JPEG reads anyway (every one down to the region's last row).
Status BuildRegionJpeg(const uint8_t* data, size_t size, const JpegRowIndex& index,
                       const JpegRegion& region, std::vector<uint8_t>* synth, uint32_t* origin_x,
                       uint32_t* origin_y, bool* worthwhile);

}  // namespace shardfeed::imaging
