#include "shardfeed/converter/options.h"

#include <zstd.h>

#include <limits>
#include <nlohmann/json.hpp>

namespace shardfeed::converter {
namespace {

using O = PackOptions;
using V = std::string_view;

// v >= min, without a "comparison is always true" warning when min is 0.
bool AtLeast(uint64_t v, uint64_t min) { return v >= min; }

template <typename T>
Status SetCount(const char* name, V t, uint64_t min, uint64_t max, T* field) {
  uint64_t v = 0;
  if (!ParseCountText(t, &v) || !AtLeast(v, min) || v > max ||
      v > uint64_t(std::numeric_limits<T>::max())) {
    std::string what = "a whole number";
    if (max < std::numeric_limits<uint64_t>::max() / 2) {
      what += " in " + std::to_string(min) + ".." + std::to_string(max);
    } else if (min > 0) {
      what += " of at least " + std::to_string(min);
    }
    return BadOption(name, what, t);
  }
  *field = static_cast<T>(v);
  return Status::OK();
}

Status SetBool(const char* name, V t, bool* field) {
  if (!ParseBoolText(t, field)) return BadOption(name, "true or false", t);
  return Status::OK();
}

std::string Bool(bool b) { return b ? "true" : "false"; }

constexpr uint64_t kAny = std::numeric_limits<uint64_t>::max();

std::vector<PackOption> MakeTable() {
  return {
      {"encoding", PackOptionKind::kChoice, "auto|jpeg|raw|zstd",
       "auto: JPEG files byte for byte, other images lossless (zstd pixels); jpeg: JPEG files "
       "byte for byte (others encoded once, lossy); raw: decoded RGB; zstd: raw, compressed",
       true,
       [](O* o, V t) -> Status {
         if (!format::ParseEncoding(t, &o->encoding)) {
           return BadOption("encoding", "one of auto, jpeg, raw, zstd", t);
         }
         return Status::OK();
       },
       [](const O& o) { return std::string(format::EncodingName(o.encoding)); }},
      {"backend", PackOptionKind::kChoice, "lmdb|hdf5", "container", true,
       [](O* o, V t) -> Status {
         if (!format::ParseBackend(t, &o->writer.backend)) {
           return BadOption("backend", "one of lmdb, hdf5", t);
         }
         return Status::OK();
       },
       [](const O& o) { return std::string(format::BackendName(o.writer.backend)); }},
      {"size", PackOptionKind::kCount, nullptr,
       "raw/zstd: resize so the short side is this. jpeg: a resolution cap: images whose "
       "short side (long side with max_side) exceeds it are resized and re-encoded at quality "
       "(upright); the others keep their bytes (0: no cap)",
       true, [](O* o, V t) { return SetCount("size", t, 0, 65535, &o->size); },
       [](const O& o) { return std::to_string(o.size); }},
      {"max_side", PackOptionKind::kBool, nullptr, "jpeg with size: cap the long side", true,
       [](O* o, V t) { return SetBool("max_side", t, &o->max_side); },
       [](const O& o) { return Bool(o.max_side); }},
      {"crop", PackOptionKind::kChoice, "none|center", "raw/zstd with size: none | center", true,
       [](O* o, V t) -> Status {
         if (t != "none" && t != "center") return BadOption("crop", "one of none, center", t);
         o->center_crop = t == "center";
         return Status::OK();
       },
       [](const O& o) { return std::string(o.center_crop ? "center" : "none"); }},
      {"quality", PackOptionKind::kCount, nullptr,
       "JPEG quality of re-encoded images (non-JPEG inputs, size caps)", true,
       [](O* o, V t) { return SetCount("quality", t, 1, 100, &o->quality); },
       [](const O& o) { return std::to_string(o.quality); }},
      {"level", PackOptionKind::kCount, nullptr, "zstd level", true,
       [](O* o, V t) { return SetCount("level", t, 1, uint64_t(ZSTD_maxCLevel()), &o->level); },
       [](const O& o) { return std::to_string(o.level); }},
      {"shuffle", PackOptionKind::kBool, nullptr, "store samples in a shuffled order", true,
       [](O* o, V t) { return SetBool("shuffle", t, &o->shuffle); },
       [](const O& o) { return Bool(o.shuffle); }},
      {"seed", PackOptionKind::kCount, nullptr, "seed for shuffle", true,
       [](O* o, V t) { return SetCount("seed", t, 0, kAny, &o->seed); },
       [](const O& o) { return std::to_string(o.seed); }},
      {"validate", PackOptionKind::kChoice, "none|header|full",
       "JPEG passthrough checks: none | header (markers + end marker) | full (decode)", true,
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
       }},
      {"max_pixels", PackOptionKind::kCount, nullptr, "refuse larger images", true,
       [](O* o, V t) { return SetCount("max_pixels", t, 1, kAny, &o->limits.max_pixels); },
       [](const O& o) { return std::to_string(o.limits.max_pixels); }},
      {"chunk_size", PackOptionKind::kBytes, nullptr,
       "records are grouped in chunks of this size (e.g. 1M)", true,
       [](O* o, V t) -> Status {
         uint64_t v = 0;
         if (!ParseByteSize(t, &v) || v == 0) {
           return BadOption("chunk_size", "a size in bytes > 0 (e.g. 512K, 1M)", t);
         }
         o->writer.chunk_bytes = v;
         return Status::OK();
       },
       [](const O& o) { return std::to_string(o.writer.chunk_bytes); }},
      {"shard_size", PackOptionKind::kBytes, nullptr,
       "start a new shard after this many bytes (e.g. 1G; 0: one shard)", true,
       [](O* o, V t) -> Status {
         uint64_t v = 0;
         if (!ParseByteSize(t, &v)) return BadOption("shard_size", "a size in bytes (e.g. 1G)", t);
         o->writer.shard_bytes = v;
         return Status::OK();
       },
       [](const O& o) { return std::to_string(o.writer.shard_bytes); }},
      {"workers", PackOptionKind::kCount, nullptr,
       "worker threads (0: all cores; the archive is the same whatever it is)", false,
       [](O* o, V t) { return SetCount("workers", t, 0, 4096, &o->workers); },
       [](const O& o) { return std::to_string(o.workers); }},
      {"strict", PackOptionKind::kBool, nullptr,
       "fail (and write no archive) if any file is skipped", false,
       [](O* o, V t) { return SetBool("strict", t, &o->strict); },
       [](const O& o) { return Bool(o.strict); }},
      {"overwrite", PackOptionKind::kBool, nullptr,
       "replace an existing archive at OUT (only a shardfeed archive)", false,
       [](O* o, V t) { return SetBool("overwrite", t, &o->writer.overwrite); },
       [](const O& o) { return Bool(o.writer.overwrite); }},
      {"part", PackOptionKind::kText, nullptr,
       "I/N: pack only part I (0-based) of N of the source list; join parts with merge", false,
       [](O* o, V t) -> Status {
         const std::string spec(t);
         unsigned i = 0, n = 0;
         char tail = 0;
         if (std::sscanf(spec.c_str(), "%u/%u%c", &i, &n, &tail) != 2 || n == 0 || i >= n) {
           return BadOption("part", "I/N with 0 <= I < N", t);
         }
         o->part = i, o->parts = n, o->part_record = true;
         return Status::OK();
       },
       [](const O& o) {
         return o.part_record ? std::to_string(o.part) + "/" + std::to_string(o.parts)
                              : std::string();
       }},
  };
}

}  // namespace

const std::vector<PackOption>& PackOptionTable() {
  static const std::vector<PackOption> table = MakeTable();
  return table;
}

const PackOption* FindPackOption(std::string_view name) {
  std::string snake(name);
  for (char& c : snake) c = c == '-' ? '_' : c;
  for (const PackOption& o : PackOptionTable()) {
    if (snake == o.name) return &o;
  }
  return nullptr;
}

Status SetPackOption(PackOptions* options, std::string_view name, std::string_view text) {
  const PackOption* o = FindPackOption(name);
  if (!o) return Status::InvalidArgument("unexpected pack option '", std::string(name), "'");
  return o->set(options, text);
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
  if (o.max_side && ((o.encoding != Encoding::kJpeg && o.encoding != Encoding::kAuto) ||
                     o.size == 0)) {
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
  if (o.workers < 0) return BadOption("workers", "a whole number", std::to_string(o.workers));
  if (o.writer.chunk_bytes == 0) return BadOption("chunk_size", "a size in bytes > 0", "0");
  if (o.parts == 0 || o.part >= o.parts) {
    return BadOption("part", "I/N with 0 <= I < N",
                     std::to_string(o.part) + "/" + std::to_string(o.parts));
  }
  return Status::OK();
}

std::string PackOptionsJson(const PackOptions& options, std::string_view source_kind) {
  nlohmann::json j = nlohmann::json::object();
  for (const PackOption& o : PackOptionTable()) {
    if (!o.recorded) continue;
    const std::string v = o.get(options);
    if (o.kind == PackOptionKind::kBool) {
      j[o.name] = v == "true";
    } else if (o.kind == PackOptionKind::kCount || o.kind == PackOptionKind::kBytes) {
      j[o.name] = std::stoull(v);
    } else {
      j[o.name] = v;
    }
  }
  j["source"] = std::string(source_kind);
  return j.dump();
}

}  // namespace shardfeed::converter
