#include "shardfeed/converter/options.h"

#include <zstd.h>

#include <limits>
#include <nlohmann/json.hpp>

namespace shardfeed::converter {
namespace {

using O = PackOptions;
using V = std::string_view;

constexpr uint64_t kAny = std::numeric_limits<uint64_t>::max();
constexpr uint64_t kMaxParts = 99999;       // part names have five digits (DefaultPartPath)
constexpr uint64_t kMaxChunk = 1ull << 30;  // a chunk is one buffer in memory

// "I/N": two whole numbers, digits only, 0 <= I < N <= kMaxParts.
Status SetPart(O* o, V t) {
  const size_t slash = t.find('/');
  uint64_t i = 0, n = 0;
  if (slash == V::npos || !ParseCountText(t.substr(0, slash), &i) ||
      !ParseCountText(t.substr(slash + 1), &n) || n == 0 || n > kMaxParts || i >= n) {
    return BadOption("part", "I/N with 0 <= I < N <= " + std::to_string(kMaxParts), t);
  }
  o->part = uint32_t(i), o->parts = uint32_t(n), o->part_record = true;
  return Status::OK();
}

// Marks an option that shapes the records (written to the manifest).
PackOption Recorded(PackOption o) {
  o.recorded = true;
  return o;
}

// long: a table, not logic: one declaration per pack option, in the order help lists them.
std::vector<PackOption> MakeTable() {
  return {
      Recorded({"encoding", OptionKind::kChoice, "auto|jpeg|raw|zstd",
                "auto: JPEG files byte for byte, other images lossless (zstd pixels); jpeg: JPEG "
                "files byte for byte (others encoded once, lossy); raw: decoded RGB; zstd: raw, "
                "compressed",
                [](O* o, V t) -> Status {
                  if (!format::ParseEncoding(t, &o->encoding)) {
                    return BadOption("encoding", "one of auto, jpeg, raw, zstd", t);
                  }
                  return Status::OK();
                },
                [](const O& o) { return std::string(format::EncodingName(o.encoding)); }}),
      Recorded({"backend", OptionKind::kChoice, "lmdb|hdf5", "container",
                [](O* o, V t) -> Status {
                  if (!format::ParseBackend(t, &o->writer.backend)) {
                    return BadOption("backend", "one of lmdb, hdf5", t);
                  }
                  return Status::OK();
                },
                [](const O& o) { return std::string(format::BackendName(o.writer.backend)); }}),
      Recorded(CountOption<O>(
          "size", 0, 65535,
          "raw/zstd: resize so the short side is this. jpeg: a resolution cap: images whose "
          "short side (long side with max_side) exceeds it are resized and re-encoded at "
          "quality (upright); the others keep their bytes (0: no cap)",
          &O::size)),
      Recorded(BoolOption<O>("max_side", "jpeg with size: cap the long side", &O::max_side)),
      Recorded({"crop", OptionKind::kChoice, "none|center", "raw/zstd with size: none | center",
                [](O* o, V t) -> Status {
                  if (t != "none" && t != "center") {
                    return BadOption("crop", "one of none, center", t);
                  }
                  o->center_crop = t == "center";
                  return Status::OK();
                },
                [](const O& o) { return std::string(o.center_crop ? "center" : "none"); }}),
      Recorded(CountOption<O>("quality", 1, 100,
                              "JPEG quality of re-encoded images (non-JPEG inputs, size caps)",
                              &O::quality)),
      Recorded(CountOption<O>("level", 1, uint64_t(ZSTD_maxCLevel()), "zstd level", &O::level)),
      Recorded(BoolOption<O>("shuffle", "store samples in a shuffled order", &O::shuffle)),
      Recorded(CountOption<O>("seed", 0, kAny, "seed for shuffle", &O::seed)),
      Recorded({"validate", OptionKind::kChoice, "none|header|full",
                "JPEG passthrough checks: none | header (markers + end marker) | full (decode)",
                [](O* o, V t) -> Status {
                  if (t == "none") return o->validation = Validation::kNone, Status::OK();
                  if (t == "header") return o->validation = Validation::kHeader, Status::OK();
                  if (t == "full") return o->validation = Validation::kFull, Status::OK();
                  return BadOption("validate", "one of none, header, full", t);
                },
                [](const O& o) {
                  return std::string(o.validation == Validation::kNone     ? "none"
                                     : o.validation == Validation::kHeader ? "header"
                                                                           : "full");
                }}),
      Recorded({"jpeg_layout", OptionKind::kChoice, "original|indexed",
                "jpeg: original (bytes as given) | indexed (re-laid losslessly with restart "
                "markers and a region index, so crops decode only the data they overlap)",
                [](O* o, V t) -> Status {
                  if (t != "original" && t != "indexed") {
                    return BadOption("jpeg_layout", "one of original, indexed", t);
                  }
                  o->jpeg_indexed = t == "indexed";
                  return Status::OK();
                },
                [](const O& o) { return std::string(o.jpeg_indexed ? "indexed" : "original"); }}),
      Recorded(CountOption<O>(
          "max_pixels", 1, kAny, "refuse larger images",
          [](auto& o) -> auto& { return o.limits.max_pixels; })),
      Recorded({"chunk_size", OptionKind::kBytes, nullptr,
                "records are grouped in chunks of this size (e.g. 1M)",
                [](O* o, V t) -> Status {
                  uint64_t v = 0;
                  if (!ParseByteSize(t, &v) || v == 0 || v > kMaxChunk) {
                    return BadOption("chunk_size", "a size in bytes in 1..1G (e.g. 512K, 1M)", t);
                  }
                  o->writer.chunk_bytes = v;
                  return Status::OK();
                },
                [](const O& o) { return std::to_string(o.writer.chunk_bytes); },
                "a size in bytes in 1..1G"}),
      Recorded({"shard_size", OptionKind::kBytes, nullptr,
                "start a new shard after this many bytes (e.g. 1G; 0: one shard)",
                [](O* o, V t) -> Status {
                  uint64_t v = 0;
                  if (!ParseByteSize(t, &v)) {
                    return BadOption("shard_size", "a size in bytes below 16E (e.g. 1G)", t);
                  }
                  o->writer.shard_bytes = v;
                  return Status::OK();
                },
                [](const O& o) { return std::to_string(o.writer.shard_bytes); },
                "a size in bytes below 16E"}),
      CountOption<O>("workers", 0, 4096,
                     "worker threads (0: all cores; the archive is the same whatever it is)",
                     &O::workers),
      BoolOption<O>("strict", "fail (and write no archive) if any file is skipped", &O::strict),
      BoolOption<O>("skip_bad",
                    "skip samples whose fields do not match the schema (and bad manifest rows), "
                    "listed like bad images, instead of failing",
                    &O::skip_bad),
      BoolOption<O>(
          "overwrite", "replace an existing archive at OUT (only a shardfeed archive)",
          [](auto& o) -> auto& { return o.writer.overwrite; }),
      {"part", OptionKind::kText, nullptr,
       "I/N: pack only part I (0-based) of N of the source list; join parts with merge", SetPart,
       [](const O& o) {
         return o.part_record ? std::to_string(o.part) + "/" + std::to_string(o.parts)
                              : std::string();
       },
       "I/N with 0 <= I < N <= " + std::to_string(kMaxParts)},
  };
}

}  // namespace

const OptionTable<PackOptions>& PackOptionTable() {
  static const OptionTable<PackOptions> table("pack option", MakeTable());
  return table;
}

const PackOption* FindPackOption(std::string_view name) { return PackOptionTable().Find(name); }

Status SetPackOption(PackOptions* options, std::string_view name, std::string_view text) {
  return PackOptionTable().Set(options, name, text);
}

Status CheckJpegLayout(bool indexed, format::Encoding encoding, const std::string& holder) {
  if (!indexed || encoding == format::Encoding::kJpeg || encoding == format::Encoding::kAuto) {
    return Status::OK();
  }
  return Status::InvalidArgument("jpeg_layout (--jpeg-layout) indexed re-lays JPEG records; ",
                                 holder, " stores none (encoding ", format::EncodingName(encoding),
                                 "; use encoding auto or jpeg, or leave jpeg_layout out)");
}

Status ValidatePackOptions(const PackOptions& o) {
  using format::Encoding;
  if (o.encoding != Encoding::kJpeg && o.center_crop && o.size == 0) {
    return Status::InvalidArgument("crop (--crop) center needs a size (--size)");
  }
  if ((o.encoding == Encoding::kJpeg || o.encoding == Encoding::kAuto) && o.center_crop) {
    return Status::InvalidArgument(
        "crop (--crop) center applies to raw and zstd records; jpeg records keep the whole "
        "image");
  }
  SF_RETURN_IF_ERROR(CheckJpegLayout(o.jpeg_indexed, o.encoding, "this pack"));
  if (o.max_side &&
      ((o.encoding != Encoding::kJpeg && o.encoding != Encoding::kAuto) || o.size == 0)) {
    return Status::InvalidArgument(
        "max_side (--max-side) applies to encoding jpeg with a size (--size)");
  }
  if (o.level < 1 || o.level > ZSTD_maxCLevel()) {
    return BadOption("level", "a whole number in 1.." + std::to_string(ZSTD_maxCLevel()),
                     std::to_string(o.level));
  }
  if (o.quality < 1 || o.quality > 100) {
    return BadOption("quality", "a whole number in 1..100", std::to_string(o.quality));
  }
  if (o.workers < 0 || o.workers > 4096) {
    return BadOption("workers", CountRange(0, 4096), std::to_string(o.workers));
  }
  if (o.writer.chunk_bytes == 0) return BadOption("chunk_size", "a size in bytes > 0", "0");
  if (o.writer.chunk_bytes > kMaxChunk) {
    return BadOption("chunk_size", "a size in bytes in 1..1G",
                     std::to_string(o.writer.chunk_bytes));
  }
  if (o.strict && o.skip_bad) {
    return Status::InvalidArgument(
        "strict (--strict) and skip_bad (--skip-bad) contradict each other: strict fails on any "
        "skipped sample");
  }
  if (o.parts == 0 || o.parts > kMaxParts || o.part >= o.parts) {
    return BadOption("part", "I/N with 0 <= I < N <= " + std::to_string(kMaxParts),
                     std::to_string(o.part) + "/" + std::to_string(o.parts));
  }
  return Status::OK();
}

std::string PackOptionsJson(const PackOptions& options, std::string_view source_kind) {
  nlohmann::json j = nlohmann::json::object();
  for (const PackOption& o : PackOptionTable()) {
    if (!o.recorded) continue;
    const std::string v = o.get(options);
    if (o.kind == OptionKind::kBool) {
      j[o.name] = v == "true";
    } else if (o.kind == OptionKind::kCount || o.kind == OptionKind::kBytes) {
      j[o.name] = std::stoull(v);
    } else {
      j[o.name] = v;
    }
  }
  j["source"] = std::string(source_kind);
  return j.dump();
}

}  // namespace shardfeed::converter
