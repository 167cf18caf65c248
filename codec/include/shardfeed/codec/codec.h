// One owner per encoding: everything that depends on how a record is encoded (turning a source
// file into a record at pack time, decoding a record whole or just a crop of it, checking it,
// the file `extract` writes, the line `inspect` shows) is one Codec, and CodecFor() is the
// table. A new encoding is a new Codec in codec.cpp plus its name in format/layout.h; nothing
// else switches on the encoding. (format/ keeps the storage facts: names, pixel sizes, zstd
// frames; it knows nobody above it.)
//
// Layering: codec/ builds on format/ and imaging/; converter/ and reader/ use it and still never
// include each other.
//
// Thread-safety: Codec objects are immutable and shared; a Context is one thread's scratch
// (decoder state, buffers, zstd contexts) and must not be used by two threads at once.
// Errors: Status, never exceptions; messages say what is wrong with the record or file, and
// callers add the archive/file and sample.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "shardfeed/base/status.h"
#include "shardfeed/format/archive.h"
#include "shardfeed/imaging/image.h"
#include "shardfeed/imaging/jpeg_index.h"

namespace shardfeed::codec {

// JPEG passthrough checks at pack time.
enum class Validation {
  kNone,    // only the file signature is checked
  kHeader,  // markers parsed, end-of-image marker present (default)
  kFull,    // every image fully decoded; any corrupt data is a skip
};

// How a source file becomes a record (the record-shaping pack options).
struct EncodeOptions {
  uint32_t size = 0;      // raw/zstd: short side to resize to; jpeg: the resolution cap (0: none)
  bool max_side = false;  // jpeg with size: cap the long side
  bool center_crop = false;  // raw/zstd with size: the centre size x size
  int quality = 90;          // JPEG quality of images encoded at pack
  int level = 1;             // zstd level
  // jpeg: re-lay every record losslessly with restart markers and a region index
  // (kFlagJpegIndexed), so the reader entropy-decodes only the segments a crop overlaps. A file
  // libjpeg cannot transcode cleanly (corrupt entropy data) keeps its bytes as given.
  bool jpeg_indexed = false;
  Validation validation = Validation::kHeader;
  imaging::Limits limits;
};

// A crop rectangle in displayed (upright) pixel coordinates.
struct CropRect {
  uint32_t x = 0, y = 0, width = 0, height = 0;
};
// The rectangle of a stored image (stored size w x h) that EXIF orientation 1..8 turns into
// `displayed`.
CropRect StoredRect(const CropRect& displayed, int orientation, uint32_t w, uint32_t h);

// How a reader wants a crop decoded.
struct CropDecode {
  uint32_t out_width = 0, out_height = 0;  // the size the crop will be resized to
  bool scaled = true;                      // JPEG: DCT scaling down to the output size
  bool any_scale = false;                  // JPEG: also the n/8 scales without SIMD
  bool cropped = true;                     // JPEG: decode only the crop's rows and columns
  uint64_t max_pixels = imaging::Limits().max_pixels;
};

// Decoded pixels to resize from: `height` rows of `width` RGB pixels, `stride` bytes apart.
// Points into the Context or into the archive's mapping; valid until the next call on either.
struct Region {
  const uint8_t* pixels = nullptr;
  uint32_t width = 0, height = 0;
  size_t stride = 0;
};

// How Codec::Encode made a record's pixels from its source image's, so that values given in
// the source's pixels (boxes, masks) can follow the image (converter's SampleWriter). `kept`:
// the record holds the source's bytes (its frame is the source's). Otherwise the source
// (source_width x source_height as stored) was turned upright by EXIF `orientation`, scaled to
// via_width x via_height, the rectangle crop_* of that taken (the whole of it without a crop),
// and that scaled to the record's width x height (its IndexEntry).
struct Reshape {
  bool kept = true;
  uint32_t source_width = 0, source_height = 0;
  int orientation = 1;
  uint32_t via_width = 0, via_height = 0;
  uint32_t crop_x = 0, crop_y = 0, crop_width = 0, crop_height = 0;
  // The source's size upright (orientations 5-8 swap its sides).
  uint32_t upright_width() const { return orientation >= 5 ? source_height : source_width; }
  uint32_t upright_height() const { return orientation >= 5 ? source_width : source_height; }
};

// One thread's scratch, reused across records.
class Context {
 public:
  Context();
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  imaging::Decoder decoder;
  imaging::Image image, scratch;
  imaging::Bytes pixels;
  std::vector<uint8_t> jpeg;  // a re-laid JPEG (pack) or a region's synthetic JPEG (read)
  imaging::JpegRestartLayout layout;
  Reshape reshape;  // what the last Encode did (Codec::Encode)
  struct Zstd;
  std::unique_ptr<Zstd> zstd;
};

class Codec {
 public:
  virtual ~Codec() = default;
  virtual format::Encoding encoding() const = 0;
  // What `inspect` says the records hold.
  virtual const char* description() const = 0;
  // With these options, every record has this shape (side x side x 3): the manifest records it
  // and the loader can copy records as they are. False: shapes vary.
  virtual bool FixedShape(const EncodeOptions& options, uint32_t* side) const = 0;
  // With these options, some images may be re-encoded smaller (a resolution cap): the pack
  // counts them (the manifest's resized_records).
  virtual bool CapsResolution(const EncodeOptions& options) const = 0;

  // Pack: `payload` holds a source file's bytes; on success it holds the record, `entry` its
  // height, width, channels, orientation and flags, `*resized` says whether the record's image
  // is smaller than its source's (upright), and ctx.reshape how the record's pixels were made
  // from the source's. Bad files: kCorrupt / kUnsupported / kResourceExhausted with the reason.
  virtual Status Encode(Context& ctx, const EncodeOptions& options, imaging::Bytes* payload,
                        format::IndexEntry* entry, bool* resized) const = 0;
  // The whole record as an upright RGB image. With `strict`, data a decoder had to guess at is
  // an error.
  virtual Status Decode(Context& ctx, const format::RecordView& record,
                        const imaging::Limits& limits, bool strict, imaging::Image* out) const = 0;
  // verify --decode: decodes strictly and checks the result against the index entry.
  virtual Status Check(Context& ctx, const format::RecordView& record,
                       const imaging::Limits& limits) const = 0;
  // extract: the file that holds this record, and its extension (".jpg", ".png").
  virtual const char* file_extension() const = 0;
  virtual Status ExtractFile(Context& ctx, const format::RecordView& record,
                             std::vector<uint8_t>* file) const = 0;
  // The reader: `rect` (displayed coordinates) of the record, decoded as cheaply as an output
  // of how.out_width x how.out_height allows.
  virtual Status DecodeCrop(Context& ctx, const format::RecordView& record, const CropRect& rect,
                            const CropDecode& how, Region* out) const = 0;
};

// The table: the codec of an encoding, or kCorrupt for a value no codec owns.
Result<const Codec*> CodecFor(format::Encoding encoding);
Result<const Codec*> CodecFor(const format::IndexEntry& entry);

// Decodes a source image the way raw/zstd records are made (short side to `size`, optionally
// the centre square): the definition a pixel record is tested against.
// `reshape` (if set) receives how `out` was made from the source (never `kept`).
Status DecodeForPixels(imaging::Decoder& decoder, const uint8_t* data, size_t size,
                       const EncodeOptions& options, imaging::Image* out,
                       imaging::Image* scratch = nullptr, Reshape* reshape = nullptr);

}  // namespace shardfeed::codec
