#include "shardfeed/converter/archive_tools.h"

#include <fcntl.h>
#include <unistd.h>
#include <zstd.h>

#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "shardfeed/base/cpus.h"
#include "shardfeed/codec/codec.h"
#include "shardfeed/imaging/image.h"

namespace shardfeed::converter {
namespace {

namespace fs = std::filesystem;
using format::Encoding;
using nlohmann::json;

int ResolveWorkers(int workers) { return workers > 0 ? workers : AvailableCpus(); }

// Decodes a record the way a reader would and checks it against its index entry.
Status CheckDecodes(const format::RecordView& r, codec::Context& ctx, uint64_t max_pixels) {
  SF_RETURN_IF_ERROR(format::CheckPixelLimit(*r.entry, max_pixels));
  SF_ASSIGN_OR_RETURN(const codec::Codec* c, codec::CodecFor(*r.entry));
  imaging::Limits limits;
  limits.max_pixels = max_pixels;
  return c->Check(ctx, r, limits);
}

// Text for a terminal: control characters (escape sequences a crafted class name could carry)
// and bytes of invalid UTF-8 are shown as \xNN, backslashes doubled.
std::string Printable(const std::string& text) {
  std::string out;
  for (size_t i = 0; i < text.size();) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    bool valid = len > 0 && i + len <= text.size();
    for (size_t k = 1; valid && k < len; ++k) valid = (text[i + k] & 0xC0) == 0x80;
    if (valid && len > 1 && c == 0xC2 && static_cast<unsigned char>(text[i + 1]) < 0xA0) {
      valid = false;  // C1 control characters (U+0080..U+009F)
    }
    if (!valid || c < 0x20 || c == 0x7F || c == '\\') {
      char buf[8];
      std::snprintf(buf, sizeof(buf), c == '\\' ? "\\\\" : "\\x%02x", c);
      out += buf;
      ++i;
      continue;
    }
    out.append(text, i, len);
    i += len;
  }
  return out;
}

}  // namespace

std::string VerifyReport::ToJson() const {
  json bad = json::array();
  for (const auto& b : bad_samples) bad.push_back({{"index", b.index}, {"reason", b.reason}});
  json j = {{"archive", archive}, {"ok", ok()},         {"samples", samples},
            {"checked", checked}, {"bad_samples", bad}, {"bad_shards", bad_shards}};
  return j.dump(2, ' ', false, json::error_handler_t::replace) + "\n";
}

VerifyReport Verify(const format::Archive& archive, const VerifyOptions& options,
                    const std::function<void(uint64_t, uint64_t)>& progress) {
  VerifyReport report;
  report.archive = archive.path();
  report.samples = archive.size();
  archive.Advise(format::Archive::Access::kSequential);
  for (size_t s = 0; s < archive.manifest().shards.size(); ++s) {
    Status st = archive.VerifyShard(s);
    if (!st.ok()) report.bad_shards.push_back(st.message());
  }
  const uint64_t n = archive.size();
  const uint64_t block = 256;
  std::atomic<uint64_t> next{0}, done{0};
  std::mutex mu;
  auto work = [&]() {
    codec::Context ctx;
    for (;;) {
      uint64_t begin = next.fetch_add(block);
      if (begin >= n) break;
      uint64_t end = std::min(n, begin + block);
      for (uint64_t i = begin; i < end; ++i) {
        Status st = archive.VerifyRecord(i);
        if (st.ok() && options.decode) {
          st = CheckDecodes(archive.Get(i), ctx, options.max_pixels);
          if (!st.ok()) st = st.WithContext("sample " + std::to_string(i));
        }
        if (!st.ok()) {
          std::lock_guard<std::mutex> lock(mu);
          report.bad_samples.push_back({i, st.message()});
        }
      }
      done += end - begin;
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < ResolveWorkers(options.workers); ++t) threads.emplace_back(work);
  if (progress) {
    while (done.load() < n) {
      progress(done.load(), n);
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      bool all_exited = next.load() >= n && done.load() >= n;
      if (all_exited) break;
    }
  }
  for (auto& t : threads) t.join();
  if (progress) progress(n, n);
  report.checked = n;
  std::sort(report.bad_samples.begin(), report.bad_samples.end(),
            [](const BadSample& a, const BadSample& b) { return a.index < b.index; });
  return report;
}

namespace {

struct Summary {
  uint64_t payload = 0, pixels = 0;
  uint32_t min_h = UINT32_MAX, max_h = 0, min_w = UINT32_MAX, max_w = 0;
};

Summary Summarize(const format::Archive& archive) {
  Summary s;
  for (uint64_t i = 0; i < archive.size(); ++i) {
    auto r = archive.At(i);
    if (!r.ok()) continue;  // counted by verify; inspect summarises what can be read
    const format::IndexEntry& e = *r->entry;
    s.payload += e.size;
    s.pixels += uint64_t{e.height} * e.width * 3;
    s.min_h = std::min<uint32_t>(s.min_h, e.height);
    s.max_h = std::max<uint32_t>(s.max_h, e.height);
    s.min_w = std::min<uint32_t>(s.min_w, e.width);
    s.max_w = std::max<uint32_t>(s.max_w, e.width);
  }
  if (archive.size() == 0) s.min_h = s.min_w = 0;
  return s;
}

}  // namespace

std::string InspectJson(const format::Archive& archive) {
  const format::Manifest& m = archive.manifest();
  Summary s = Summarize(archive);
  json classes = json::array();
  for (size_t c = 0; c < m.class_names.size(); ++c) {
    classes.push_back({{"label", c},
                       {"name", m.class_names[c]},
                       {"count", c < m.class_counts.size() ? m.class_counts[c] : 0}});
  }
  json shards = json::array();
  for (const auto& sh : m.shards) {
    shards.push_back({{"file", sh.file}, {"samples", sh.sample_count}, {"bytes", sh.file_bytes}});
  }
  json j = {
      {"archive", archive.path()},
      {"format_version", m.format_version},
      {"backend", std::string(format::BackendName(m.backend))},
      {"encoding", std::string(format::EncodingName(m.encoding))},
      {"samples", m.sample_count},
      {"classes", classes},
      {"shape", m.height ? json::array({m.height, m.width, m.channels}) : json(nullptr)},
      {"height_range", {s.min_h, s.max_h}},
      {"width_range", {s.min_w, s.max_w}},
      {"payload_bytes", s.payload},
      {"bytes_on_disk", archive.FileBytes()},
      {"decoded_bytes", s.pixels},
      {"source_bytes", m.source_bytes},
      {"resized_records", m.resized_records ? json(*m.resized_records) : json(nullptr)},
      {"compression_ratio", s.payload ? double(s.pixels) / double(s.payload) : 0.0},
      {"shards", shards},
      {"created_by", m.created_by},
      {"created_at", m.created_at},
  };
  return j.dump(2, ' ', false, json::error_handler_t::replace) + "\n";
}

std::string InspectText(const format::Archive& archive) {
  const format::Manifest& m = archive.manifest();
  Summary s = Summarize(archive);
  std::ostringstream o;
  auto mb = [](uint64_t b) { return double(b) / 1e6; };
  o << "archive:     " << Printable(archive.path()) << "\n";
  o << "format:      shardfeed v" << m.format_version << ", " << format::BackendName(m.backend)
    << ", " << m.shards.size() << " shard(s)\n";
  o << "encoding:    " << format::EncodingName(m.encoding);
  if (auto c = codec::CodecFor(m.encoding); c.ok()) o << " (" << (*c)->description() << ")";
  o << "\n";
  o << "samples:     " << m.sample_count << "\n";
  if (m.height) {
    o << "shape:       " << m.height << "x" << m.width << "x" << m.channels << " (fixed)\n";
  } else {
    o << "shape:       variable, height " << s.min_h << ".." << s.max_h << ", width " << s.min_w
      << ".." << s.max_w << "\n";
  }
  char buf[256];
  std::snprintf(buf, sizeof(buf),
                "bytes:       %.2f MB on disk, %.2f MB of records, %.2f MB of source files\n"
                "compression: %.2fx (decoded RGB bytes / record bytes)\n",
                mb(archive.FileBytes()), mb(s.payload), mb(m.source_bytes),
                s.payload ? double(s.pixels) / double(s.payload) : 0.0);
  o << buf;
  if (m.resized_records) {
    // The cap is in the recorded pack options.
    json opts = json::parse(m.options_json.empty() ? "{}" : m.options_json, nullptr, false);
    std::string cap;
    if (opts.is_object() && opts.contains("size") && opts["size"].is_number_unsigned()) {
      const bool long_side = opts.value("max_side", false);
      cap = " (" + std::string(long_side ? "long" : "short") + " side over " +
            std::to_string(opts["size"].get<uint64_t>()) + " px" +
            (opts.contains("quality") ? ", re-encoded at quality " + opts["quality"].dump() : "") +
            ")";
    }
    o << "resized:     " << *m.resized_records << " of " << m.sample_count
      << " records decoded, resized and re-encoded at pack" << cap
      << "; the others are the source files' bytes\n";
  }
  o << "classes:     " << m.class_names.size() << "\n";
  for (size_t c = 0; c < m.class_names.size(); ++c) {
    o << "  " << c << "\t" << (c < m.class_counts.size() ? m.class_counts[c] : 0) << "\t"
      << Printable(m.class_names[c]) << "\n";
  }
  return o.str();
}

Status WriteNewFile(const std::string& path, const uint8_t* data, size_t size) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0 && errno == EEXIST) {
    return Status::InvalidArgument(path,
                                   ": exists; shardfeed writes only new files here "
                                   "(remove it or choose another name)");
  }
  if (fd < 0) return Status::IOError(path, ": ", std::strerror(errno));
  size_t off = 0;
  while (off < size) {
    ssize_t n = ::write(fd, data + off, size - off);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int err = errno;
      ::close(fd);
      return Status::IOError(path, ": ", std::strerror(err));
    }
    off += static_cast<size_t>(n);
  }
  if (::close(fd) != 0) return Status::IOError(path, ": ", std::strerror(errno));
  return Status::OK();
}

namespace {

// Class names come from folder names or list labels; keep them usable as one path component.
std::string SafeComponent(const std::string& name) {
  std::string out = name;
  for (char& c : out) {
    if (c == '/' || c == 0) c = '_';
  }
  if (out.empty() || out == "." || out == "..") out = "_" + out;
  return out;
}

}  // namespace

Result<uint64_t> Extract(const format::Archive& archive, const std::string& dir) {
  std::error_code ec;
  if (fs::exists(dir, ec) && !(fs::is_directory(dir, ec) && fs::is_empty(dir, ec))) {
    return Status::InvalidArgument(dir, ": exists and is not an empty directory");
  }
  const format::Manifest& m = archive.manifest();
  for (const std::string& name : m.class_names) {
    fs::create_directories(fs::path(dir) / SafeComponent(name), ec);
    if (ec) return Status::IOError(dir, "/", name, ": ", ec.message());
  }
  codec::Context ctx;
  std::vector<uint8_t> file;
  const int digits = std::max<int>(8, static_cast<int>(std::to_string(archive.size()).size()));
  for (uint64_t i = 0; i < archive.size(); ++i) {
    format::RecordView r = archive.Get(i);
    SF_RETURN_IF_ERROR(archive.VerifyRecord(i));
    const format::IndexEntry& e = *r.entry;
    SF_ASSIGN_OR_RETURN(const codec::Codec* c, codec::CodecFor(e));
    std::string name = std::to_string(i);
    name = std::string(static_cast<size_t>(std::max<int>(0, digits - int(name.size()))), '0') +
           name + c->file_extension();
    std::string path = (fs::path(dir) / SafeComponent(m.class_names[e.label]) / name).string();
    SF_RETURN_IF_ERROR(c->ExtractFile(ctx, r, &file)
                           .WithContext(archive.path() + ": sample " + std::to_string(i)));
    SF_RETURN_IF_ERROR(WriteNewFile(path, file.data(), file.size()));
  }
  return archive.size();
}

Result<uint64_t> Convert(const format::Archive& archive, const std::string& out,
                         format::Backend backend, bool overwrite, bool jpeg_indexed) {
  const format::Manifest& m = archive.manifest();
  format::WriterOptions wo;
  wo.backend = backend;
  wo.overwrite = overwrite;
  wo.protect.push_back(archive.path());
  wo.encoding = m.encoding;
  wo.height = m.height;
  wo.width = m.width;
  // The pack options are free-form, for humans: take a value only if it has the right type.
  if (auto j = json::parse(m.options_json, nullptr, false); j.is_object()) {
    // "chunk_size" since the pack options table (converter/options.h); "chunk_bytes" before.
    for (const char* key : {"chunk_size", "chunk_bytes"}) {
      if (auto it = j.find(key); it != j.end() && it->is_number_unsigned() &&
                                 it->get<uint64_t>() > 0 &&
                                 it->get<uint64_t>() <= (uint64_t{1} << 31)) {
        wo.chunk_bytes = it->get<uint64_t>();
        break;
      }
    }
    if (auto it = j.find("level"); it != j.end() && it->is_number_integer() &&
                                   it->get<int64_t>() >= 1 && it->get<int64_t>() <= 22) {
      wo.zstd_level = static_cast<int>(it->get<int64_t>());
    }
  }
  if (wo.chunk_bytes == 0) wo.chunk_bytes = 1 << 20;
  SF_ASSIGN_OR_RETURN(auto writer, format::ArchiveWriter::Create(out, wo));
  // --jpeg-layout indexed: the JPEG codec's own pack-time re-layout, on the stored bytes.
  const bool relayout = jpeg_indexed && m.encoding == format::Encoding::kJpeg;
  SF_ASSIGN_OR_RETURN(const codec::Codec* jpeg, codec::CodecFor(format::Encoding::kJpeg));
  codec::EncodeOptions encode;
  encode.jpeg_indexed = true;
  encode.validation = codec::Validation::kNone;  // the records were checked when packed
  codec::Context ctx;
  imaging::Bytes payload;
  size_t shard = 0;
  for (uint64_t i = 0; i < archive.size(); ++i) {
    while (shard + 1 < m.shards.size() && i >= m.shards[shard + 1].first_sample) {
      ++shard;
      SF_RETURN_IF_ERROR(writer->NextShard());
    }
    SF_RETURN_IF_ERROR(archive.VerifyRecord(i));  // never copy damage into a fresh checksum
    format::RecordView r = archive.Get(i);
    if (relayout && !(r.entry->flags & format::kFlagJpegIndexed)) {
      payload.assign(r.data, r.data + r.size);
      format::IndexEntry fresh{};
      bool resized = false;
      SF_RETURN_IF_ERROR(jpeg->Encode(ctx, encode, &payload, &fresh, &resized)
                             .WithContext(archive.path() + ": sample " + std::to_string(i)));
      format::IndexEntry e = *r.entry;
      e.flags = fresh.flags;
      SF_RETURN_IF_ERROR(writer->Append(e, payload.data(), payload.size()));
      continue;
    }
    SF_RETURN_IF_ERROR(writer->Append(*r.entry, r.data, r.size));
  }
  format::Manifest copy = format::SameRecordsAs(m);
  if (relayout) {
    json j = json::parse(m.options_json, nullptr, false);
    if (!j.is_object()) j = json::object();
    j["jpeg_layout"] = "indexed";
    copy.options_json = j.dump();
  }
  copy.source_bytes = m.source_bytes;
  copy.created_by = "shardfeed " SHARDFEED_VERSION " (converted from " +
                    std::string(format::BackendName(m.backend)) + ")";
  SF_RETURN_IF_ERROR(writer->Finish(std::move(copy)));
  return archive.size();
}

}  // namespace shardfeed::converter

namespace shardfeed::converter {

Status DecodeSample(const format::Archive& archive, uint64_t index, imaging::Image* out,
                    uint64_t max_pixels) {
  auto decode = [&]() -> Status {
    SF_RETURN_IF_ERROR(archive.VerifyRecord(index));
    SF_ASSIGN_OR_RETURN(const format::RecordView r, archive.At(index));
    SF_RETURN_IF_ERROR(format::CheckPixelLimit(*r.entry, max_pixels));
    SF_ASSIGN_OR_RETURN(const codec::Codec* c, codec::CodecFor(*r.entry));
    codec::Context ctx;
    imaging::Limits limits;
    limits.max_pixels = max_pixels;
    return c->Decode(ctx, r, limits, /*strict=*/false, out);
  };
  return decode().WithContext(archive.path() + ": sample " + std::to_string(index));
}

Result<imaging::Image> ContactSheet(const format::Archive& archive, const ContactSheetOptions& o) {
  if (o.per_class == 0 || o.per_class > 64) {
    return Status::InvalidArgument("per_class (--per-class) must be in 1..64, not ", o.per_class);
  }
  if (o.tile < 16 || o.tile > 512) {
    return Status::InvalidArgument("size (--size) must be in 16..512, not ", o.tile);
  }
  const format::Manifest& m = archive.manifest();
  const size_t classes = std::min<size_t>(m.class_names.size(), o.max_classes);
  if (classes == 0) return Status::InvalidArgument(archive.path(), ": no classes to show");
  // The first per_class samples of each class, in archive order (one pass over the index).
  std::vector<std::vector<uint64_t>> picked(classes);
  size_t full = 0;
  for (uint64_t i = 0; i < archive.size() && full < classes; ++i) {
    SF_ASSIGN_OR_RETURN(const format::RecordView r, archive.At(i));
    const size_t label = static_cast<size_t>(r.entry->label);
    if (label < classes && picked[label].size() < o.per_class) {
      picked[label].push_back(i);
      full += picked[label].size() == o.per_class;
    }
  }
  // Layout: a label column, then tiles with a caption line beneath each.
  const uint32_t pad = 6, caption = imaging::kTextCellHeight + 4;
  size_t longest = 0;
  for (size_t c = 0; c < classes; ++c) {
    longest = std::max(longest, std::to_string(c).size() + 1 + m.class_names[c].size());
  }
  const uint32_t label_w =
      static_cast<uint32_t>(std::min<size_t>(longest, 28) * imaging::kTextCellWidth) + 2 * pad;
  const uint32_t row_h = o.tile + caption + pad;
  imaging::Image sheet;
  sheet.Resize(label_w + o.per_class * (o.tile + pad) + pad,
               static_cast<uint32_t>(classes) * row_h + pad, 3);
  std::fill(sheet.pixels.begin(), sheet.pixels.end(), uint8_t{255});
  const uint8_t black[3] = {0, 0, 0}, grey[3] = {90, 90, 90};
  imaging::Image img, thumb;
  for (size_t c = 0; c < classes; ++c) {
    const uint32_t y0 = pad + static_cast<uint32_t>(c) * row_h;
    std::string label = std::to_string(c) + " " + Printable(m.class_names[c]);
    if (label.size() > 28) label = label.substr(0, 27) + "~";
    imaging::DrawText(&sheet, pad, y0 + (o.tile - imaging::kTextCellHeight) / 2, label, 1, black);
    for (size_t k = 0; k < picked[c].size(); ++k) {
      const uint64_t index = picked[c][k];
      const uint32_t x0 = label_w + static_cast<uint32_t>(k) * (o.tile + pad);
      // The tile's background: light grey (red when the sample does not decode).
      const bool ok = DecodeSample(archive, index, &img).ok();
      for (uint32_t y = 0; y < o.tile; ++y) {
        uint8_t* row = sheet.pixels.data() + (size_t{y0 + y} * sheet.width + x0) * 3;
        for (uint32_t x = 0; x < o.tile; ++x) {
          row[3 * x] = ok ? 225 : 220;
          row[3 * x + 1] = ok ? 225 : 40;
          row[3 * x + 2] = ok ? 225 : 40;
        }
      }
      if (ok && img.width > 0 && img.height > 0) {
        const double s = std::min(double(o.tile) / img.width, double(o.tile) / img.height);
        const uint32_t tw = std::max<uint32_t>(1, static_cast<uint32_t>(img.width * s));
        const uint32_t th = std::max<uint32_t>(1, static_cast<uint32_t>(img.height * s));
        const uint32_t tx = x0 + (o.tile - tw) / 2, ty = y0 + (o.tile - th) / 2;
        imaging::ResizeInto(img.pixels.data(), img.width, img.height, 0, 3,
                            sheet.pixels.data() + (size_t{ty} * sheet.width + tx) * 3, tw, th,
                            size_t{sheet.width} * 3);
      }
      imaging::DrawText(&sheet, x0, y0 + o.tile + 2, "#" + std::to_string(index), 1, grey);
    }
  }
  return sheet;
}

}  // namespace shardfeed::converter
