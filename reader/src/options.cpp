#include "shardfeed/reader/options.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>

#include "shardfeed/base/option_text.h"

namespace shardfeed::reader {
namespace {

// v >= min, without a "comparison is always true" warning when min is 0.
bool AtLeast(uint64_t v, uint64_t min) { return v >= min; }

std::string CountWhat(uint64_t min) {
  return min == 0 ? "a whole number" : "a whole number of at least " + std::to_string(min);
}

#define SF_BOOL(NAME, FIELD, HELP)                                                         \
  LoaderOption {                                                                           \
#NAME, OptionKind::kBool, nullptr, HELP,                                                 \
        [](LoaderOptions* o, std::string_view t) -> Status {                                 \
          bool v = false;                                                                    \
          if (!ParseBoolText(t, &v)) return BadOption(#NAME, "true or false", t);                      \
          o->FIELD = v;                                                                      \
          return Status::OK();                                                               \
        },                                                                                   \
        [](const LoaderOptions& o) { return std::string(o.FIELD ? "true" : "false"); } \
  }

#define SF_COUNT(NAME, FIELD, MIN, HELP)                                                    \
  LoaderOption {                                                                            \
#NAME, OptionKind::kCount, nullptr, HELP,                                                 \
        [](LoaderOptions* o, std::string_view t) -> Status {                                  \
          using T = decltype(o->FIELD);                                                       \
          uint64_t v = 0;                                                                     \
          if (!ParseCountText(t, &v) || !AtLeast(v, MIN) ||                                       \
              v > uint64_t(std::numeric_limits<T>::max())) {                                  \
            return BadOption(#NAME, CountWhat(MIN), t);                                             \
          }                                                                                   \
          o->FIELD = static_cast<T>(v);                                                       \
          return Status::OK();                                                                \
        },                                                                                    \
        [](const LoaderOptions& o) { return std::to_string(o.FIELD); } \
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

Status SetChannels(const char* name, std::string_view t, std::array<float, 3>* field) {
  std::vector<double> v;
  if (!ParseNumberList(t, 3, true, &v)) return BadOption(name, "one number or three (R,G,B)", t);
  *field = {float(v[0]), float(v[1]), float(v[2])};
  return Status::OK();
}

std::string Channels(const std::array<float, 3>& c) {
  return NumberText(c[0]) + "," + NumberText(c[1]) + "," + NumberText(c[2]);
}

std::vector<LoaderOption> MakeTable() {
  using O = LoaderOptions;
  using V = std::string_view;
  return {
      SF_COUNT(batch_size, batch_size, 1, "samples per batch"),
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
      SF_COUNT(seed, seed, 0, "seed of the order and of the augmentation draws"),
      SF_BOOL(drop_last, drop_last, "leave out the last, short batch"),
      SF_COUNT(shuffle_block, shuffle_block, 0,
               "locality-friendly shuffle for archives larger than RAM: blocks of this many "
               "consecutive samples (0: a true global shuffle)"),
      SF_COUNT(shuffle_window, shuffle_window, 1,
               "with shuffle_block: samples are mixed within windows of this many blocks"),
      SF_COUNT(rank, rank, 0, "this process's rank (distributed training)"),
      SF_COUNT(world_size, world_size, 1, "the number of ranks"),
      {"workers", OptionKind::kText, nullptr,
       "decode workers: a number, 0 (the CPUs this process may use: affinity and cgroup "
       "quota), or auto (tuned online from the consumer's wait; see max_workers, wait_target)",
       [](O* o, V t) -> Status {
         uint64_t v = 0;
         if (t == "auto") return o->workers = LoaderOptions::kAutoWorkers, Status::OK();
         if (!ParseCountText(t, &v) || v > 4096) {
           return BadOption("workers", "a whole number or auto", t);
         }
         o->workers = static_cast<int>(v);
         return Status::OK();
       },
       [](const O& o) {
         return o.workers == LoaderOptions::kAutoWorkers ? std::string("auto")
                                                         : std::to_string(o.workers);
       }},
      SF_COUNT(max_workers, max_workers, 0,
               "workers=auto: at most this many (0: the CPUs this process may use)"),
      {"wait_target", OptionKind::kNumber, nullptr,
       "workers or prefetch auto: the consumer may wait this fraction of its time for data",
       [](O* o, V t) -> Status {
         double v = 0;
         if (!ParseNumberText(t, &v) || !(v > 0 && v < 1)) {
           return BadOption("wait_target", "a fraction in (0, 1)", t);
         }
         o->wait_target = v;
         return Status::OK();
       },
       [](const O& o) { return NumberText(o.wait_target); }},
      {"prefetch", OptionKind::kText, nullptr,
       "ring slots: batches decoded ahead (memory = prefetch x batch), or auto (the shallowest "
       "ring that keeps the consumer fed, within max_prefetch and ring_mb)",
       [](O* o, V t) -> Status {
         uint64_t v = 0;
         if (t == "auto") return o->prefetch = LoaderOptions::kAutoPrefetch, Status::OK();
         if (!ParseCountText(t, &v) || v < 1 || v > 4096) {
           return BadOption("prefetch", "a whole number of at least 1, or auto", t);
         }
         o->prefetch = static_cast<uint32_t>(v);
         return Status::OK();
       },
       [](const O& o) {
         return o.prefetch == LoaderOptions::kAutoPrefetch ? std::string("auto")
                                                           : std::to_string(o.prefetch);
       }},
      {"max_prefetch", OptionKind::kCount, nullptr,
       "prefetch=auto: at most this many slots (0: 16)",
       [](O* o, V t) -> Status {
         uint64_t v = 0;
         if (!ParseCountText(t, &v) || v == 1 || v > 4096) {
           return BadOption("max_prefetch", "0 or a whole number of at least 2", t);
         }
         o->max_prefetch = static_cast<uint32_t>(v);
         return Status::OK();
       },
       [](const O& o) { return std::to_string(o.max_prefetch); }},
      SF_COUNT(ring_mb, ring_mb, 0,
               "prefetch=auto: the ring's memory budget in MiB (0: 1/8 of the memory this "
               "process may use, at most 4096)"),
      SF_BOOL(run_ahead, run_ahead,
              "once an epoch's samples are all handed out, start the next epoch in the free "
              "ring slots (kept if it is the epoch asked for next, from its start)"),
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
      SF_BOOL(normalize_on_device, normalize_on_device,
              "with a CUDA device and a float dtype: copy uint8, normalise on the GPU"),
      {"timeout", OptionKind::kNumber, nullptr,
       "seconds with no sample completed before a wait fails (0 or none: forever)",
       [](O* o, V t) -> Status {
         double v = 0;
         if (t == "none" || t == "None") return o->timeout = 0, Status::OK();
         if (!ParseNumberText(t, &v) || v < 0)
           return BadOption("timeout", "a number of seconds >= 0", t);
         o->timeout = v;
         return Status::OK();
       },
       [](const O& o) { return NumberText(o.timeout); }},
      SF_BOOL(skip_errors, skip_errors,
              "a sample that fails to decode becomes zeros with label -1 (counted)"),
      {"crop", OptionKind::kChoice, "center|random|none|squash",
       "center, random (RandomResizedCrop), none (whole images, undistorted: a fixed-shape "
       "archive's stored shape) or squash (whole images resized to size x size, aspect ratio "
       "not kept)",
       [](O* o, V t) {
         return SetChoice("crop", "center|random|none|squash", ParseCrop(t), t, &o->transform.crop);
       },
       [](const O& o) { return std::string(CropName(o.transform.crop)); }},
      SF_COUNT(size, transform.size, 0,
               "output side (0: 224 for center, random and squash; the stored shape for none)"),
      SF_BOOL(flip, transform.flip, "random horizontal flip (p = 0.5)"),
      {"center_ratio", OptionKind::kNumber, nullptr,
       "center crop: the crop's side over the short side (224/256)",
       [](O* o, V t) -> Status {
         double v = 0;
         if (!ParseNumberText(t, &v) || !(v > 0 && v <= 1)) {
           return BadOption("center_ratio", "a number in (0, 1]", t);
         }
         o->transform.center_ratio = v;
         return Status::OK();
       },
       [](const O& o) { return NumberText(o.transform.center_ratio); }},
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
       "float dtypes: per-channel mean R,G,B in 0..1 units (ImageNet: 0.485,0.456,0.406)",
       [](O* o, V t) { return SetChannels("mean", t, &o->transform.mean); },
       [](const O& o) { return Channels(o.transform.mean); }},
      {"std", OptionKind::kList, nullptr,
       "float dtypes: per-channel std R,G,B in 0..1 units (ImageNet: 0.229,0.224,0.225)",
       [](O* o, V t) { return SetChannels("std", t, &o->transform.std); },
       [](const O& o) { return Channels(o.transform.std); }},
      {"decode", OptionKind::kChoice, "scaled|scaled-any|cropped|full",
       "JPEG decoding: scaled (DCT scales 1/8, 2/8, 4/8, cropped rows and columns), "
       "scaled-any (also 3/8, 5/8, 6/8, 7/8: no SIMD, slower with libjpeg-turbo 2.x), cropped "
       "(full scale), full (whole image, then crop)",
       SetDecode, GetDecode},
      SF_BOOL(verify_checksums, transform.verify_checksums,
              "check each record's XXH3 before decoding it"),
      SF_COUNT(max_pixels, transform.max_pixels, 1,
               "a record declaring more pixels is that sample's error"),
  };
}

#undef SF_BOOL
#undef SF_COUNT

}  // namespace

const std::vector<LoaderOption>& LoaderOptionTable() {
  static const std::vector<LoaderOption> table = MakeTable();
  return table;
}

const LoaderOption* FindLoaderOption(std::string_view name) {
  std::string snake(name);
  for (char& c : snake) c = c == '-' ? '_' : c;
  for (const LoaderOption& o : LoaderOptionTable()) {
    if (snake == o.name) return &o;
  }
  return nullptr;
}

Status SetLoaderOption(LoaderOptions* options, std::string_view name, std::string_view text) {
  const LoaderOption* o = FindLoaderOption(name);
  if (!o) return Status::InvalidArgument("unexpected loader option '", std::string(name), "'");
  return o->set(options, text);
}

Status ValidateLoaderOptions(const LoaderOptions& o) {
  if (o.batch_size == 0) return BadOption("batch_size", CountWhat(1), "0");
  if (o.prefetch > 4096) {
    return BadOption("prefetch", "a whole number of at least 1, or auto",
                     std::to_string(o.prefetch));
  }
  if (o.max_prefetch == 1 || o.max_prefetch > 4096) {
    return BadOption("max_prefetch", "0 or a whole number of at least 2",
                     std::to_string(o.max_prefetch));
  }
  if (o.workers < LoaderOptions::kAutoWorkers) {
    return BadOption("workers", "a whole number or auto", std::to_string(o.workers));
  }
  if (!(o.wait_target > 0 && o.wait_target < 1)) {
    return BadOption("wait_target", "a fraction in (0, 1)", NumberText(o.wait_target));
  }
  if (o.world_size == 0 || o.rank >= o.world_size) {
    return Status::InvalidArgument("rank ", o.rank, " is not below world_size ", o.world_size);
  }
  if (!(o.timeout >= 0))
    return BadOption("timeout", "a number of seconds >= 0", NumberText(o.timeout));
  SF_RETURN_IF_ERROR(ValidateTransform(o.transform));
  if (o.normalize_on_device && (!o.device || o.transform.dtype == DType::kUint8)) {
    return Status::InvalidArgument(
        "normalize_on_device needs device copies and a float dtype (float32, float16 or "
        "bfloat16)");
  }
  return Status::OK();
}

}  // namespace shardfeed::reader
