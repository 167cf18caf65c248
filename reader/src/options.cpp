#include "shardfeed/reader/options.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>

#include "shardfeed/base/option_text.h"

namespace shardfeed::reader {
namespace {

constexpr uint64_t kAny = std::numeric_limits<uint64_t>::max();
constexpr uint64_t kMaxBatch = 65536;   // a 224x224 RGB uint8 batch of this is 9.9 GB per slot
constexpr uint64_t kMaxWorkers = 4096;  // threads or processes; more is refused, not attempted
constexpr uint64_t kMaxSlots = 4096;
constexpr double kMaxTimeout = 1e8;  // seconds (3 years): "forever" is 0 or none

// A field reached through the transform options.
#define SF_T(FIELD) \
  [](auto& o) -> auto& { return o.transform.FIELD; }

Status SetBoundedCount(const char* name, std::string_view t, uint64_t min, uint64_t max,
                       const char* also, uint64_t* v) {
  if (ParseCountText(t, v) && *v >= min && *v <= max) return Status::OK();
  return BadOption(name, CountRange(min, max) + also, t);
}

Status SetDecode(LoaderOptions* o, std::string_view t) {
  TransformOptions& x = o->transform;
  if (t == "scaled" || t == "scaled-any") {
    x.scaled_decode = x.cropped_decode = true;
    x.any_scale = t == "scaled-any";
  } else if (t == "cropped") {
    x.scaled_decode = false, x.cropped_decode = true, x.any_scale = false;
  } else if (t == "full") {
    x.scaled_decode = x.cropped_decode = x.any_scale = false;
  } else {
    return BadOption("decode", "one of scaled, scaled-any, cropped, full", t);
  }
  return Status::OK();
}

std::string GetDecode(const LoaderOptions& o) {
  const TransformOptions& x = o.transform;
  if (!x.cropped_decode) return "full";
  if (!x.scaled_decode) return "cropped";
  return x.any_scale ? "scaled-any" : "scaled";
}

Status SetDevice(LoaderOptions* o, std::string_view t) {
  if (t == "cpu") {
    o->device = false, o->device_index = -1;
    return Status::OK();
  }
  if (t == "cuda") {
    o->device = true, o->device_index = -1;
    return Status::OK();
  }
  uint64_t n = 0;
  if (t.substr(0, 5) == "cuda:" && ParseCountText(t.substr(5), &n) && n < 1024) {
    o->device = true, o->device_index = static_cast<int>(n);
    return Status::OK();
  }
  return BadOption("device", "cpu, cuda or cuda:N", t);
}

std::string GetDevice(const LoaderOptions& o) {
  if (!o.device) return "cpu";
  return o.device_index >= 0 ? "cuda:" + std::to_string(o.device_index) : "cuda";
}

template <typename E>
Status SetChoice(const char* name, const char* choices, Result<E> parsed, std::string_view t,
                 E* field) {
  if (!parsed.ok()) {
    std::string list(choices);
    for (char& c : list) c = c == '|' ? ',' : c;
    std::string what = "one of " + list;
    for (size_t p = what.find(','); p != std::string::npos; p = what.find(',', p + 2)) {
      what.insert(p + 1, " ");
    }
    return BadOption(name, what, t);
  }
  *field = *parsed;
  return Status::OK();
}

const char* CropName(Crop c) {
  switch (c) {
    case Crop::kNone:
      return "none";
    case Crop::kCenter:
      return "center";
    case Crop::kRandom:
      return "random";
    case Crop::kSquash:
      return "squash";
  }
  return "?";
}

Status SetPair(const char* name, std::string_view t, double* lo, double* hi) {
  std::vector<double> v;
  if (!ParseNumberList(t, 2, false, &v)) return BadOption(name, "two numbers MIN,MAX", t);
  *lo = v[0], *hi = v[1];
  return Status::OK();
}

Status SetChannels(const char* name, std::string_view t, TransformOptions* o,
                   std::array<float, 3>* field) {
  if (t == "archive") return o->stats_from_archive = true, Status::OK();
  std::vector<double> v;
  if (!ParseNumberList(t, 3, true, &v)) {
    return BadOption(name, "one number or three (R,G,B), or archive", t);
  }
  *field = {float(v[0]), float(v[1]), float(v[2])};
  return Status::OK();
}

std::string Channels(const std::array<float, 3>& c) {
  return NumberText(c[0]) + "," + NumberText(c[1]) + "," + NumberText(c[2]);
}

// "a,b,c" (names), "default" or "None" (every field but a folder pack's path), "*" (every
// field), "" (none).
Status SetFields(LoaderOptions* o, std::string_view t) {
  if (t == "*" || t == "None" || t == "default") {
    o->all_fields = true;
    o->source_path_too = t == "*";
    o->fields.clear();
    return Status::OK();
  }
  std::vector<std::string> names;
  while (!t.empty()) {
    const size_t comma = t.find(',');
    std::string_view name = t.substr(0, comma);
    while (!name.empty() && name.front() == ' ') name.remove_prefix(1);
    while (!name.empty() && name.back() == ' ') name.remove_suffix(1);
    if (name.empty()) return BadOption("fields", "field names separated by commas, * or empty", t);
    names.emplace_back(name);
    if (comma == std::string_view::npos) break;
    t.remove_prefix(comma + 1);
  }
  o->all_fields = false;
  o->fields = std::move(names);
  return Status::OK();
}

std::string GetFields(const LoaderOptions& o) {
  if (o.all_fields) return o.source_path_too ? "*" : "default";
  std::string out;
  for (const std::string& f : o.fields) out += (out.empty() ? "" : ",") + f;
  return out;
}

// long: by design, one declaration per option, in the order help lists them; split,
// the order and the one-place-per-option reading would scatter.
std::vector<LoaderOption> MakeTable() {
  using O = LoaderOptions;
  using V = std::string_view;
  return {
      CountOption<O>("batch_size", 1, kMaxBatch, "samples per batch", &O::batch_size),
      {"shuffle", OptionKind::kBool, nullptr,
       "a new order every epoch (seeded): true (global), false, or block (shards in a seeded "
       "order, samples mixed within windows of shuffle_window shards: for remote archives)",
       [](O* o, V t) -> Status {
         bool v = false;
         o->shuffle_by_shard = t == "block";
         if (o->shuffle_by_shard) return o->shuffle = true, Status::OK();
         if (!ParseBoolText(t, &v)) return BadOption("shuffle", "true, false or block", t);
         o->shuffle = v;
         return Status::OK();
       },
       [](const O& o) {
         return std::string(o.shuffle_by_shard ? "block" : o.shuffle ? "true" : "false");
       }},
      CountOption<O>("seed", 0, kAny, "seed of the order and of the augmentation draws", &O::seed),
      BoolOption<O>("drop_last", "leave out the last, short batch", &O::drop_last),
      CountOption<O>("shuffle_block", 0, kAny,
                     "locality-friendly shuffle for archives larger than RAM: blocks of this "
                     "many consecutive samples (0: a true global shuffle)",
                     &O::shuffle_block),
      {"shuffle_window", OptionKind::kText, nullptr,
       "with shuffle_block or shuffle=block: samples are mixed within windows of this many "
       "blocks or shards; auto: 8, or for a remote archive with shuffle=block the most up to 8 "
       "that cache_limit allows",
       [](O* o, V t) -> Status {
         uint64_t v = 0;
         if (t == "auto") return o->shuffle_window = LoaderOptions::kAutoWindow, Status::OK();
         SF_RETURN_IF_ERROR(SetBoundedCount("shuffle_window", t, 1, UINT32_MAX, ", or auto", &v));
         o->shuffle_window = static_cast<uint32_t>(v);
         return Status::OK();
       },
       [](const O& o) {
         return o.shuffle_window == LoaderOptions::kAutoWindow ? std::string("auto")
                                                               : std::to_string(o.shuffle_window);
       },
       CountRange(1, UINT32_MAX) + ", or auto"},
      CountOption<O>("rank", 0, kAny,
                     "this process's rank (distributed training; below world_size)", &O::rank),
      CountOption<O>("world_size", 1, kAny, "the number of ranks", &O::world_size),
      {"workers", OptionKind::kText, nullptr,
       "decode workers: a number, 0 (the CPUs this process may use: affinity and cgroup "
       "quota), or auto (tuned online from the consumer's wait; see max_workers, wait_target)",
       [](O* o, V t) -> Status {
         uint64_t v = 0;
         if (t == "auto") return o->workers = LoaderOptions::kAutoWorkers, Status::OK();
         SF_RETURN_IF_ERROR(SetBoundedCount("workers", t, 0, kMaxWorkers, ", or auto", &v));
         o->workers = static_cast<int>(v);
         return Status::OK();
       },
       [](const O& o) {
         return o.workers == LoaderOptions::kAutoWorkers ? std::string("auto")
                                                         : std::to_string(o.workers);
       },
       CountRange(0, kMaxWorkers) + ", or auto"},
      CountOption<O>("max_workers", 0, kMaxWorkers,
                     "workers=auto (and tune's CPU budget): at most this many (0: the CPUs this "
                     "process may use)",
                     &O::max_workers),
      NumberOption<O>("wait_target", {0, 1, true, true},
                      "workers or prefetch auto: the consumer may wait this fraction of its time "
                      "for data",
                      &O::wait_target),
      {"prefetch", OptionKind::kText, nullptr,
       "ring slots: batches decoded ahead (memory = prefetch x batch), or auto (the shallowest "
       "ring that keeps the consumer fed, within max_prefetch and ring_mb)",
       [](O* o, V t) -> Status {
         uint64_t v = 0;
         if (t == "auto") return o->prefetch = LoaderOptions::kAutoPrefetch, Status::OK();
         SF_RETURN_IF_ERROR(SetBoundedCount("prefetch", t, 1, kMaxSlots, ", or auto", &v));
         o->prefetch = static_cast<uint32_t>(v);
         return Status::OK();
       },
       [](const O& o) {
         return o.prefetch == LoaderOptions::kAutoPrefetch ? std::string("auto")
                                                           : std::to_string(o.prefetch);
       },
       CountRange(1, kMaxSlots) + ", or auto"},
      {"max_prefetch", OptionKind::kCount, nullptr,
       "prefetch=auto: at most this many slots (0: 16)",
       [](O* o, V t) -> Status {
         uint64_t v = 0;
         if (!ParseCountText(t, &v) || v == 1 || v > kMaxSlots) {
           return BadOption("max_prefetch", "0 or a whole number in 2..4096", t);
         }
         o->max_prefetch = static_cast<uint32_t>(v);
         return Status::OK();
       },
       [](const O& o) { return std::to_string(o.max_prefetch); }, "0 or a whole number in 2..4096"},
      CountOption<O>("ring_mb", 0, 1 << 20,
                     "prefetch=auto: the ring's memory budget in MiB (0: 1/8 of the memory this "
                     "process may use, at most 4096)",
                     &O::ring_mb),
      CountOption<O>("kept_mb", 0, 1 << 20,
                     "memory in MiB for batches the consumer keeps beyond the ring (0: a quarter "
                     "of the memory this process may use); past it Next() fails naming this "
                     "option",
                     &O::kept_mb),
      BoolOption<O>("run_ahead",
                    "once an epoch's samples are all handed out, start the next epoch in the free "
                    "ring slots (kept if it is the epoch asked for next, from its start)",
                    &O::run_ahead),
      {"mode", OptionKind::kChoice, "threads|processes",
       "workers as threads, or as shardfeed-worker processes",
       [](O* o, V t) -> Status {
         if (t == "threads") return o->mode = WorkerMode::kThreads, Status::OK();
         if (t == "processes") return o->mode = WorkerMode::kProcesses, Status::OK();
         return BadOption("mode", "one of threads, processes", t);
       },
       [](const O& o) {
         return std::string(o.mode == WorkerMode::kThreads ? "threads" : "processes");
       }},
      {"device", OptionKind::kText, nullptr,
       "cpu, or cuda / cuda:N: batches copied to that CUDA device", SetDevice, GetDevice},
      BoolOption<O>("normalize_on_device",
                    "with a CUDA device and a float dtype: copy uint8, normalise on the GPU",
                    &O::normalize_on_device),
      {"timeout", OptionKind::kNumber, nullptr,
       "seconds with no sample completed (nor, for a remote archive read by threads, any byte "
       "downloaded) before a wait fails (0 or none: forever)",
       [](O* o, V t) -> Status {
         if (t == "none" || t == "None") return o->timeout = 0, Status::OK();
         return ParseNumberOption("timeout", t, {0, kMaxTimeout}, &o->timeout);
       },
       [](const O& o) { return NumberText(o.timeout); }, NumberRangeText({0, kMaxTimeout})},
      BoolOption<O>("skip_errors",
                    "a sample that fails to decode becomes zeros with label -1 (counted)",
                    &O::skip_errors),
      {"crop", OptionKind::kChoice, "center|random|none|squash",
       "center, random (RandomResizedCrop), none (whole images, undistorted: a fixed-shape "
       "archive's stored shape) or squash (whole images resized to size x size, aspect ratio "
       "not kept)",
       [](O* o, V t) {
         return SetChoice("crop", "center|random|none|squash", ParseCrop(t), t, &o->transform.crop);
       },
       [](const O& o) { return std::string(CropName(o.transform.crop)); }},
      CountOption<O>("size", 0, 65535,
                     "output side (0: 224 for center, random and squash; the stored shape for "
                     "none)",
                     SF_T(size)),
      BoolOption<O>("flip", "random horizontal flip (p = 0.5)", SF_T(flip)),
      NumberOption<O>("center_ratio", {0, 1, true, false},
                      "center crop: the crop's side over the short side (224/256)",
                      SF_T(center_ratio)),
      {"scale", OptionKind::kList, nullptr, "random crop: area fraction MIN,MAX (0.08,1)",
       [](O* o, V t) {
         return SetPair("scale", t, &o->transform.scale_min, &o->transform.scale_max);
       },
       [](const O& o) {
         return NumberText(o.transform.scale_min) + "," + NumberText(o.transform.scale_max);
       }},
      {"ratio", OptionKind::kList, nullptr, "random crop: aspect ratio MIN,MAX (3/4,4/3)",
       [](O* o, V t) {
         return SetPair("ratio", t, &o->transform.ratio_min, &o->transform.ratio_max);
       },
       [](const O& o) {
         return NumberText(o.transform.ratio_min) + "," + NumberText(o.transform.ratio_max);
       }},
      {"layout", OptionKind::kChoice, "nhwc|nchw", "element order of a batch",
       [](O* o, V t) {
         return SetChoice("layout", "nhwc|nchw", ParseLayout(t), t, &o->transform.layout);
       },
       [](const O& o) {
         return std::string(o.transform.layout == Layout::kNHWC ? "nhwc" : "nchw");
       }},
      {"dtype", OptionKind::kChoice, "uint8|float32|float16|bfloat16",
       "element type; floats are (x / 255 - mean) / std",
       [](O* o, V t) {
         return SetChoice("dtype", "uint8|float32|float16|bfloat16", ParseDType(t), t,
                          &o->transform.dtype);
       },
       [](const O& o) { return std::string(DTypeName(o.transform.dtype)); }},
      {"mean", OptionKind::kList, nullptr,
       "float dtypes: per-channel mean R,G,B in 0..1 units (ImageNet: 0.485,0.456,0.406), or "
       "archive: mean and std from `shardfeed stats ARCHIVE --save`",
       [](O* o, V t) { return SetChannels("mean", t, &o->transform, &o->transform.mean); },
       [](const O& o) {
         return o.transform.stats_from_archive ? "archive" : Channels(o.transform.mean);
       }},
      {"std", OptionKind::kList, nullptr,
       "float dtypes: per-channel std R,G,B in 0..1 units (ImageNet: 0.229,0.224,0.225), or "
       "archive (as mean)",
       [](O* o, V t) { return SetChannels("std", t, &o->transform, &o->transform.std); },
       [](const O& o) {
         return o.transform.stats_from_archive ? "archive" : Channels(o.transform.std);
       }},
      {"decode", OptionKind::kChoice, "scaled|scaled-any|cropped|full",
       "JPEG decoding: scaled (DCT scales 1/8, 2/8, 4/8, cropped rows and columns), "
       "scaled-any (also 3/8, 5/8, 6/8, 7/8: no SIMD, slower with libjpeg-turbo 2.x), cropped "
       "(full scale), full (whole image, then crop)",
       SetDecode, GetDecode},
      BoolOption<O>("verify_checksums",
                    "check each record's XXH3 before decoding it (default true; false is unsafe: "
                    "a damaged record is then decoded and trained on)",
                    SF_T(verify_checksums)),
      CountOption<O>("max_pixels", 1, kAny, "a record declaring more pixels is that sample's error",
                     SF_T(max_pixels)),
      {"fields", OptionKind::kText, nullptr,
       "fields of the archive's schema each batch carries besides images and labels: names "
       "separated by commas, default (every field but a str field named path, the source path "
       "a folder pack keeps for tracing), * (every field) or empty (none)",
       SetFields, GetFields, "field names separated by commas, default, * or empty"},
      {"ragged", OptionKind::kChoice, "list|offsets",
       "Python: a variable-length field as a list of per-sample arrays, or as (values, offsets)",
       [](O* o, V t) -> Status {
         if (t == "list") return o->ragged = LoaderOptions::Ragged::kList, Status::OK();
         if (t == "offsets") return o->ragged = LoaderOptions::Ragged::kOffsets, Status::OK();
         return BadOption("ragged", "one of list, offsets", t);
       },
       [](const O& o) {
         return std::string(o.ragged == LoaderOptions::Ragged::kList ? "list" : "offsets");
       }},
  };
}

#undef SF_T

}  // namespace

const OptionTable<LoaderOptions>& LoaderOptionTable() {
  static const OptionTable<LoaderOptions> table("loader option", MakeTable());
  return table;
}

const LoaderOption* FindLoaderOption(std::string_view name) {
  return LoaderOptionTable().Find(name);
}

Status SetLoaderOption(LoaderOptions* options, std::string_view name, std::string_view text) {
  return LoaderOptionTable().Set(options, name, text);
}

Status ValidateLoaderOptions(const LoaderOptions& o) {
  if (o.batch_size == 0 || o.batch_size > kMaxBatch) {
    return BadOption("batch_size", CountRange(1, kMaxBatch), std::to_string(o.batch_size));
  }
  if (o.max_workers > kMaxWorkers) {
    return BadOption("max_workers", CountRange(0, kMaxWorkers), std::to_string(o.max_workers));
  }
  if (o.prefetch > 4096) {
    return BadOption("prefetch", CountRange(1, kMaxSlots) + ", or auto",
                     std::to_string(o.prefetch));
  }
  if (o.max_prefetch == 1 || o.max_prefetch > 4096) {
    return BadOption("max_prefetch", "0 or a whole number in 2..4096",
                     std::to_string(o.max_prefetch));
  }
  if (o.workers < LoaderOptions::kAutoWorkers || o.workers > int(kMaxWorkers)) {
    return BadOption("workers", CountRange(0, kMaxWorkers) + ", or auto",
                     std::to_string(o.workers));
  }
  if (!(o.wait_target > 0 && o.wait_target < 1)) {
    return BadOption("wait_target", "a fraction in (0, 1)", NumberText(o.wait_target));
  }
  if (o.world_size == 0 || o.rank >= o.world_size) {
    return Status::InvalidArgument("rank ", o.rank, " is not below world_size ", o.world_size);
  }
  if (!(o.timeout >= 0 && o.timeout <= kMaxTimeout)) {
    return BadOption("timeout", NumberRangeText({0, kMaxTimeout}), NumberText(o.timeout));
  }
  SF_RETURN_IF_ERROR(ValidateTransform(o.transform));
  if (o.normalize_on_device && (!o.device || o.transform.dtype == DType::kUint8)) {
    return Status::InvalidArgument(
        "normalize_on_device needs device copies and a float dtype (float32, float16 or "
        "bfloat16)");
  }
  return Status::OK();
}

}  // namespace shardfeed::reader
