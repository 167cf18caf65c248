#include "font_6x11.h"
#include "shardfeed/imaging/image.h"

namespace shardfeed::imaging {

uint32_t DrawText(Image* image, uint32_t x, uint32_t y, std::string_view text, int scale,
                  const uint8_t rgb[3]) {
  scale = scale < 1 ? 1 : scale;
  uint32_t cx = x;
  for (char ch : text) {
    const unsigned char c = static_cast<unsigned char>(ch);
    const uint8_t* glyph = font::kGlyphs[(c >= 32 && c < 127 ? c : '?') - 32];
    for (int gy = 0; gy < font::kHeight; ++gy) {
      for (int gx = 0; gx < font::kWidth; ++gx) {
        if (!(glyph[gy] & (1 << (font::kWidth - 1 - gx)))) continue;
        for (int sy = 0; sy < scale; ++sy) {
          for (int sx = 0; sx < scale; ++sx) {
            const uint64_t px = cx + uint64_t(gx) * scale + sx, py = y + uint64_t(gy) * scale + sy;
            if (px >= image->width || py >= image->height) continue;
            uint8_t* p = image->pixels.data() + (py * image->width + px) * image->channels;
            for (uint32_t k = 0; k < 3 && k < image->channels; ++k) p[k] = rgb[k];
          }
        }
      }
    }
    cx += static_cast<uint32_t>(font::kWidth * scale);
  }
  return cx - x;
}

}  // namespace shardfeed::imaging
