// The parallel, ordered packer: workers prepare records out of order inside a bounded window;
// the calling thread appends them strictly in source order, so the archive does not depend on
// the worker count or on scheduling.
#include "shardfeed/converter/pack.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zstd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "shardfeed/base/cpus.h"
#include "shardfeed/base/random.h"
#include "shardfeed/converter/options.h"

namespace shardfeed::converter {
namespace {

using format::Encoding;
using format::IndexEntry;

// Reads a regular file whose first bytes are an image signature. Refuses FIFOs and devices (they
// could block or never end), and looks at 64 bytes before reading the rest, so a folder's stray
// videos and archives cost one small read each.
constexpr uint64_t kMaxFileBytes = uint64_t{1} << 31;  // a record's limit

Status ReadFile(const std::string& path, imaging::Bytes* out) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    int err = errno;
    struct stat lst;
    if (err == ENOENT && ::lstat(path.c_str(), &lst) == 0 && S_ISLNK(lst.st_mode)) {
      return Status::IOError("unreadable: dangling symbolic link");
    }
    return Status::IOError("unreadable: ", std::strerror(err));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return Status::IOError("not a regular file");
  }
  if (static_cast<uint64_t>(st.st_size) > kMaxFileBytes) {
    ::close(fd);
    return Status::Unsupported("file of ", st.st_size, " bytes is larger than 2 GiB");
  }
  out->resize(static_cast<size_t>(st.st_size));
  size_t got = 0;
  bool sniffed = false;
  while (got < out->size()) {
    // The first read takes at most 64 bytes: enough to recognise every supported format.
    size_t want = sniffed ? out->size() - got : std::min<size_t>(64, out->size());
    ssize_t n = ::read(fd, out->data() + got, want);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int err = errno;
      ::close(fd);
      return Status::IOError("read failed: ", std::strerror(err));
    }
    if (n == 0) break;  // the file shrank while we read it
    got += static_cast<size_t>(n);
    if (!sniffed && got >= std::min<size_t>(64, out->size())) {
      sniffed = true;
      if (imaging::SniffFormat(out->data(), got) == imaging::ImageFormat::kUnknown) {
        ::close(fd);
        out->resize(got);
        return got == 0 ? Status::Corrupt("empty file")
                        : Status::Unsupported("not an image (unrecognised file signature)");
      }
    }
  }
  ::close(fd);
  out->resize(got);
  if (got == 0) return Status::Corrupt("empty file");
  return Status::OK();
}

struct Prepared {
  Status status;
  IndexEntry entry{};
  imaging::Bytes payload;
  uint64_t source_bytes = 0;
  bool resized = false;    // re-encoded smaller (PackOptions::size with jpeg)
  bool reencoded = false;  // the record does not hold the source file's bytes
};

// The codecs records are made with: one for every file, or (encoding auto) JPEG inputs kept by
// the JPEG codec and every other input stored lossless by the zstd codec.
struct RecordCodecs {
  const codec::Codec* all = nullptr;  // null with encoding auto
  const codec::Codec* jpeg = nullptr;
  const codec::Codec* other = nullptr;
};

// Reads the file into the record buffer and lets the encoding's codec make the record of it.
void PrepareRecord(codec::Context& ctx, const RecordCodecs& codecs, const SourceItem& item,
                   const codec::EncodeOptions& opt, Prepared* out) {
  out->status = Status::OK();
  out->resized = false;
  imaging::Bytes& file = out->payload;  // the file is read into the payload buffer: no copy
  Status s = ReadFile(item.path, &file);
  if (!s.ok()) {
    out->status = s;
    return;
  }
  out->source_bytes = file.size();
  const bool jpeg_input =
      imaging::SniffFormat(file.data(), file.size()) == imaging::ImageFormat::kJpeg;
  const codec::Codec& codec = codecs.all ? *codecs.all : jpeg_input ? *codecs.jpeg : *codecs.other;
  IndexEntry& e = out->entry;
  e = IndexEntry{};
  e.label = item.label;
  e.encoding = static_cast<uint8_t>(codec.encoding());
  e.orientation = 1;
  out->status = codec.Encode(ctx, opt, &file, &e, &out->resized);
  out->reencoded = !(codec.encoding() == format::Encoding::kJpeg && jpeg_input && !out->resized);
}

}  // namespace

codec::EncodeOptions EncodeOptionsOf(const PackOptions& o) {
  codec::EncodeOptions e;
  e.size = o.size;
  e.max_side = o.max_side;
  e.center_crop = o.center_crop;
  e.quality = o.quality;
  e.level = o.level;
  e.validation = o.validation;
  e.jpeg_indexed = o.jpeg_indexed;
  e.limits = o.limits;
  return e;
}

Status DecodeForRecord(imaging::Decoder& decoder, const uint8_t* data, size_t size,
                       const PackOptions& options, imaging::Image* out, imaging::Image* scratch) {
  return codec::DecodeForPixels(decoder, data, size, EncodeOptionsOf(options), out, scratch);
}

uint64_t SourceFingerprint(const SourceList& source, const std::vector<SourceItem>& items) {
  std::string text;
  for (const std::string& c : source.class_names) text += c + '\n';
  const std::string root =
      source.root.empty() || source.root.back() == '/' ? source.root : source.root + "/";
  for (const SourceItem& item : items) {
    const bool under_root = item.path.compare(0, root.size(), root) == 0;
    text += (under_root ? item.path.substr(root.size()) : item.path) + '\0' +
            std::to_string(item.label) + '\n';
  }
  return format::RecordChecksum(text.data(), text.size());
}

void ShuffleItems(std::vector<SourceItem>* items, uint64_t seed) {
  Rng rng(seed);
  for (size_t i = items->size(); i > 1; --i) {
    size_t j = static_cast<size_t>(rng.Next() % i);
    std::swap((*items)[i - 1], (*items)[j]);
  }
}

namespace {

// The items of part `options.part` of `options.parts` (all of them when not split), and the
// part's record. Every part computes the whole list, so parts agree on their slices without
// talking; merge checks they saw the same list (paths relative to the root) and options.
format::PartInfo SliceForPart(const SourceList& source, const PackOptions& options,
                              std::vector<SourceItem>* items) {
  format::PartInfo part;
  if (options.parts <= 1 && !options.part_record) return part;
  part.index = options.part;
  part.count = options.parts;
  part.total_items = items->size();
  part.first_item = items->size() * options.part / options.parts;
  part.source_fingerprint = SourceFingerprint(source, *items);
  part.options_fingerprint =
      format::RecordChecksum(options.options_json.data(), options.options_json.size());
  const uint64_t end = items->size() * (uint64_t{options.part} + 1) / options.parts;
  *items = std::vector<SourceItem>(items->begin() + part.first_item, items->begin() + end);
  return part;
}

Result<RecordCodecs> CodecsFor(format::Encoding encoding) {
  RecordCodecs codecs;
  SF_ASSIGN_OR_RETURN(codecs.jpeg, codec::CodecFor(format::Encoding::kJpeg));
  SF_ASSIGN_OR_RETURN(codecs.other, codec::CodecFor(format::Encoding::kZstd));
  if (encoding != format::Encoding::kAuto) {
    SF_ASSIGN_OR_RETURN(codecs.all, codec::CodecFor(encoding));
  }
  return codecs;
}

// No archive without a record (an empty part is fine: its siblings hold the records).
Status CheckSomethingPacked(const PackResult& result, const format::PartInfo& part) {
  if (result.stats.packed > 0 || (part.count > 0 && result.stats.total == 0)) {
    return Status::OK();
  }
  if (result.skipped.empty()) {
    return Status::InvalidArgument("no image files found (", result.ignored.size(),
                                   " files ignored); no archive written");
  }
  // Bad data, not bad arguments: every candidate was skipped (the CLI exits 1).
  return Status::Corrupt("no image could be packed (", result.skipped.size(),
                         " files skipped); no archive written");
}

// Appends a prepared record (or records why its file was skipped) and counts it. The error that
// ends the pack: the writer's, or a skip under --strict.
Status WritePrepared(const Prepared& slot, const SourceItem& item, bool strict,
                     const std::string& out, format::ArchiveWriter* writer, PackResult* result) {
  PackStats& stats = result->stats;
  ++stats.done;
  if (!slot.status.ok()) {
    result->skipped.push_back({item.path, slot.status.message()});
    if (!strict) return Status::OK();
    return Status(slot.status.code(),
                  item.path + ": " + slot.status.message() + " (--strict: no archive written)");
  }
  Status s = writer->Append(slot.entry, slot.payload.data(), slot.payload.size());
  if (!s.ok()) return s.WithContext(out);
  ++stats.packed;
  stats.resized += slot.resized;
  stats.reencoded += slot.reencoded;
  stats.source_bytes += slot.source_bytes;
  stats.payload_bytes += slot.payload.size();
  return Status::OK();
}

// The manifest of a finished pack (the writer adds counts, shards and a shape it detects).
format::Manifest ManifestFor(const SourceList& source, const PackOptions& options,
                             const PackStats& stats, const format::PartInfo& part,
                             uint32_t fixed_side) {
  format::Manifest manifest;
  manifest.encoding = options.encoding;
  manifest.class_names = source.class_names;
  if (fixed_side > 0) {
    manifest.height = manifest.width = fixed_side;
    manifest.channels = 3;
  }
  manifest.source_bytes = stats.source_bytes;
  manifest.reencoded_records = stats.reencoded;
  manifest.created_by = "shardfeed " SHARDFEED_VERSION;
  manifest.options_json = options.options_json;
  manifest.is_part = part.count > 0;
  manifest.part = part;
  return manifest;
}

}  // namespace

// About 110 lines: the prepare/write pipeline (window, slots, both condition variables and the
// workers' lambda) shares its state and its locking rules in one place on purpose.
Status Pack(const SourceList& source, const std::string& out, const PackOptions& options,
            PackResult* result_out, const ProgressFn& progress) {
  PackResult& result = *result_out;
  result = PackResult();
  result.output = out;
  result.ignored = source.ignored;
  result.encoding = options.encoding;
  SF_RETURN_IF_ERROR(ValidatePackOptions(options));
  if (options.encoding == format::Encoding::kAuto && options.size > 0) {
    // A resolution cap is the JPEG encoding's (resized images are re-encoded as JPEG): with a
    // size, auto packs as jpeg, as pack did before auto existed.
    PackOptions as_jpeg = options;
    as_jpeg.encoding = format::Encoding::kJpeg;
    return Pack(source, out, as_jpeg, result_out, progress);
  }
  std::vector<SourceItem> items = source.items;
  if (options.shuffle) ShuffleItems(&items, options.seed);
  const format::PartInfo part = SliceForPart(source, options, &items);

  format::WriterOptions writer_options = options.writer;
  if (!source.root.empty()) writer_options.protect.push_back(source.root);
  writer_options.encoding = options.encoding;
  writer_options.zstd_level = options.level;
  const bool auto_encoding = options.encoding == format::Encoding::kAuto;
  SF_ASSIGN_OR_RETURN(const RecordCodecs codecs, CodecsFor(options.encoding));
  const codec::Codec* record_codec = auto_encoding ? codecs.other : codecs.all;
  const codec::EncodeOptions encode = EncodeOptionsOf(options);
  uint32_t fixed_side = 0;
  if (!auto_encoding && record_codec->FixedShape(encode, &fixed_side)) {
    writer_options.height = writer_options.width = fixed_side;
  }
  SF_ASSIGN_OR_RETURN(auto writer, format::ArchiveWriter::Create(out, writer_options));

  PackStats& stats = result.stats;
  stats.total = items.size();
  const auto start = std::chrono::steady_clock::now();

  int workers = options.workers > 0 ? options.workers : AvailableCpus();
  // Window of prepared-but-unwritten records: bounds memory whatever the input order costs.
  const size_t window = static_cast<size_t>(workers) * 16;
  std::vector<Prepared> slots(window);
  std::vector<char> ready(window, 0);
  std::mutex mu;
  std::condition_variable cv_ready, cv_space;
  size_t next_claim = 0, next_write = 0;
  // Bytes held by prepared-but-unwritten records. Past the budget only the record the writer
  // waits for may be prepared, so a folder of huge images cannot take the memory.
  constexpr uint64_t kPendingBudget = uint64_t{1} << 30;
  uint64_t pending_bytes = 0;
  bool stop = false;

  auto work = [&]() {
    codec::Context ctx;
    for (;;) {
      size_t i;
      {
        std::unique_lock<std::mutex> lock(mu);
        cv_space.wait(lock, [&] {
          return stop || (next_claim < next_write + window &&
                          (pending_bytes < kPendingBudget || next_claim == next_write));
        });
        if (stop || next_claim >= items.size()) return;
        i = next_claim++;
      }
      Prepared& slot = slots[i % window];
      PrepareRecord(ctx, codecs, items[i], encode, &slot);
      {
        std::lock_guard<std::mutex> lock(mu);
        ready[i % window] = 1;
        pending_bytes += slot.payload.capacity();
      }
      cv_ready.notify_all();
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < workers; ++t) threads.emplace_back(work);

  Status failure;
  auto last_progress = start;
  for (size_t i = 0; i < items.size(); ++i) {
    {
      std::unique_lock<std::mutex> lock(mu);
      cv_ready.wait(lock, [&] { return ready[i % window] != 0; });
    }
    Prepared& slot = slots[i % window];
    failure = WritePrepared(slot, items[i], options.strict, out, writer.get(), &result);
    {
      std::lock_guard<std::mutex> lock(mu);
      pending_bytes -= slot.payload.capacity();
      // A slot keeps its buffer for the next record, unless one huge image left it oversized.
      if (slot.payload.capacity() > (uint64_t{64} << 20)) imaging::Bytes().swap(slot.payload);
      ready[i % window] = 0;
      ++next_write;
      if (!failure.ok()) stop = true;
    }
    cv_space.notify_all();
    if (!failure.ok()) break;
    auto now = std::chrono::steady_clock::now();
    if (progress && now - last_progress > std::chrono::milliseconds(100)) {
      stats.seconds = std::chrono::duration<double>(now - start).count();
      progress(stats);
      last_progress = now;
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    stop = true;
  }
  cv_space.notify_all();
  for (auto& t : threads) t.join();
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!failure.ok()) return failure;  // the writer's destructor removes the partial output
  SF_RETURN_IF_ERROR(CheckSomethingPacked(result, part));

  format::Manifest manifest = ManifestFor(source, options, stats, part, fixed_side);
  if (!auto_encoding && record_codec->CapsResolution(encode)) {
    manifest.resized_records = stats.resized;
  }
  SF_RETURN_IF_ERROR(writer->Finish(std::move(manifest)));
  if (progress) progress(stats);
  return Status::OK();
}

std::string PackReportJson(const PackResult& result, const std::string& source) {
  using nlohmann::json;
  auto list = [](const std::vector<SkippedFile>& files) {
    json a = json::array();
    for (const auto& f : files) a.push_back({{"path", f.path}, {"reason", f.reason}});
    return a;
  };
  json j = {{"source", source},
            {"output", result.output},
            {"total", result.stats.total},
            {"packed", result.stats.packed},
            {"resized", result.stats.resized},
            {"reencoded", result.stats.reencoded},
            {"skipped_count", result.skipped.size()},
            {"skipped", list(result.skipped)},
            {"ignored", list(result.ignored)},
            {"source_bytes", result.stats.source_bytes},
            {"payload_bytes", result.stats.payload_bytes},
            {"seconds", result.stats.seconds}};
  // File names need not be UTF-8: replace invalid bytes rather than fail to write the report.
  return j.dump(2, ' ', false, json::error_handler_t::replace) + "\n";
}

}  // namespace shardfeed::converter
