// Geometry that follows the image (issue 21): where a sample's boxes and masks land in the
// loader's output image. A worker records, per sample, how it placed the image (SampleGeometry:
// EXIF orientation, the crop in upright pixels, the output size, the flip); the functions here
// apply the same placement to boxes and masks given in the *stored* image's pixels, so a box or
// mask always covers the same pixels of the output image as it did of the stored one.
//
// The mapping, for a stored point (continuous coordinates, pixel x covering [x, x + 1)):
//   1. EXIF orientation: the stored image turned upright (StoredToUpright), as the decoder does;
//   2. crop and resize: u' = (u - crop.x) * out_width / crop.width, likewise v (the resize maps
//      the crop's edges onto the output's edges);
//   3. flip: u'' = out_width - u'.
// Boxes are then clipped to [0, out_width] x [0, out_height] and a box is kept only when its
// clipped width and height are both at least kMinBoxSide output pixels (torchvision's
// SanitizeBoundingBoxes with its default min_size=1); NaN and inverted boxes are dropped.
// Masks are resampled by nearest neighbour: output pixel (i, j) takes the stored pixel whose
// upright position holds the output pixel's centre mapped back through steps 1-3.
//
// All functions are pure and thread-safe; only MapMask allocates (two index tables).
#pragma once

#include <cstddef>
#include <cstdint>

#include "shardfeed/codec/codec.h"

namespace shardfeed::reader {

// A box must keep at least this width and height (output pixels) after clipping.
inline constexpr float kMinBoxSide = 1.0f;

// How one sample's image was placed into its output (written by the worker that decoded it).
struct SampleGeometry {
  uint32_t stored_width = 0, stored_height = 0;  // the record as stored (before orientation)
  codec::CropRect crop;                          // in upright (displayed) pixels
  uint32_t out_width = 0, out_height = 0;
  uint8_t orientation = 1;  // EXIF orientation 1..8 the decoder applied
  uint8_t flip = 0;         // 1: mirrored left-right after the resize
  uint8_t valid = 0;        // 0: no image was placed (a skipped sample): no boxes, a zero mask
  uint8_t reserved = 0;
};

// The upright position of stored point (x, y) of a stored image of `width` x `height` under
// EXIF `orientation` (1..8; anything else is taken as 1).
void StoredToUpright(int orientation, uint32_t width, uint32_t height, double x, double y,
                     double* u, double* v);

// Maps `n` boxes (float32 x0, y0, x1, y1 each, in stored pixels; `in` need not be aligned) into
// output pixels as the header says. Writes the kept boxes, in their order, to `out` (room for n
// boxes) and, when `rows` is not null, each kept box's row number in `in`. Returns how many
// were kept. An invalid geometry keeps none.
size_t MapBoxes(const SampleGeometry& g, const void* in, size_t n, float* out, uint32_t* rows);

// Resamples a mask of g.stored_height x g.stored_width bytes into g.out_height x g.out_width
// bytes at `out` (nearest neighbour, as the header says). An invalid geometry writes zeros.
void MapMask(const SampleGeometry& g, const uint8_t* mask, uint8_t* out);

}  // namespace shardfeed::reader
