// Internal: checks run on a file before stb_image decodes it. stb_image reads past the end of
// its buffer as zero bytes and reports nothing, so a truncated BMP, GIF or PNM would decode to
// an image with black, white or uninitialised rows and no error. These walk each format's own
// sizes and say how much is missing. Each returns OK for files it does not recognise (stb then
// gives its own error) and is safe on any bytes.
#pragma once

#include <cstddef>
#include <cstdint>

#include "shardfeed/base/status.h"

namespace shardfeed::imaging {

// Binary PNM (P5, P6): 8-bit only, all pixel data present.
Status CheckPnm(const uint8_t* d, size_t n);
// BMP with uncompressed rows: every row the header promises is in the file.
Status CheckBmp(const uint8_t* d, size_t n);
// GIF: the block structure is whole up to the end of the first image (the frame decoded).
Status CheckGif(const uint8_t* d, size_t n);

}  // namespace shardfeed::imaging
