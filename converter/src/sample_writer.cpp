// The parallel, ordered writer: workers prepare records out of order inside a bounded window; the
// thread that calls Write()/Finish() appends them strictly in the order they were written, so the
// archive does not depend on the worker count or on scheduling. Pack (pack.cpp) is a loop over
// this.
#include "shardfeed/converter/sample_writer.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>

#include "shardfeed/base/cpus.h"
#include "shardfeed/converter/options.h"

namespace shardfeed::converter {

format::FieldValue OwnedValue::view() const {
  format::FieldValue v;
  v.data = bytes.data();
  v.size = bytes.size();
  v.dims = dims;
  v.ndim = ndim;
  v.present = present;
  return v;
}

namespace {
template <typename T>
OwnedValue Scalar(T value) {
  OwnedValue v;
  v.bytes.resize(sizeof(T));
  std::memcpy(v.bytes.data(), &value, sizeof(T));
  v.present = true;
  return v;
}
}  // namespace

OwnedValue OwnedValue::Int64(int64_t v) { return Scalar(v); }
OwnedValue OwnedValue::Float32(float v) { return Scalar(v); }
OwnedValue OwnedValue::Float64(double v) { return Scalar(v); }

OwnedValue OwnedValue::Text(std::string_view text) {
  OwnedValue v;
  v.bytes.assign(text.begin(), text.end());
  v.present = true;
  return v;
}

OwnedValue OwnedValue::Array(const void* data, size_t size, const std::vector<uint32_t>& dims) {
  OwnedValue v;
  const auto* p = static_cast<const uint8_t*>(data);
  v.bytes.assign(p, p + size);
  v.ndim = static_cast<uint32_t>(std::min(dims.size(), format::kMaxDims));
  for (uint32_t i = 0; i < v.ndim; ++i) v.dims[i] = dims[i];
  v.present = true;
  return v;
}

namespace {

using format::Encoding;
using format::IndexEntry;

constexpr uint64_t kMaxFileBytes = uint64_t{1} << 31;  // a record's limit

// Reads a regular file (or `length` bytes of it from `offset`, when length > 0) whose first bytes
// are an image signature. Refuses FIFOs and devices (they could block or never end), and looks
// at 64 bytes before reading the rest, so a folder's stray videos and archives cost one small
// read each.
Status ReadImageFile(const std::string& path, uint64_t offset, uint64_t length,
                     imaging::Bytes* out) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    int err = errno;
    struct stat lst;
    if (err == ENOENT && ::lstat(path.c_str(), &lst) == 0 && S_ISLNK(lst.st_mode)) {
      return Status::IOError("unreadable: dangling symbolic link");
    }
    struct stat st;  // open() of a socket fails (ENXIO: "No such device or address")
    if (err == ENXIO && ::stat(path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode)) {
      return Status::IOError("not a regular file (a socket)");
    }
    return Status::IOError("unreadable: ", std::strerror(err));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return Status::IOError("not a regular file");
  }
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);
  if (length > 0 && (offset > file_size || length > file_size - offset)) {
    ::close(fd);
    return Status::Corrupt("bytes ", offset, "..", offset + length, " lie outside the file (",
                           file_size, " bytes)");
  }
  const uint64_t want_total = length > 0 ? length : file_size;
  if (want_total > kMaxFileBytes) {
    ::close(fd);
    return Status::Unsupported("image of ", want_total, " bytes is larger than 2 GiB");
  }
  out->resize(static_cast<size_t>(want_total));
  size_t got = 0;
  bool sniffed = false;
  while (got < out->size()) {
    // The first read takes at most 64 bytes: enough to recognise every supported format.
    size_t want = sniffed ? out->size() - got : std::min<size_t>(64, out->size());
    ssize_t n = ::pread(fd, out->data() + got, want, static_cast<off_t>(offset + got));
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

// Pixels in, an image file out that every codec reads losslessly: a binary PPM (P6) header in
// front of the pixels (one copy; the zstd codec decodes it back to the same pixels).
Status PixelsToPpm(const imaging::Bytes& pixels, uint32_t height, uint32_t width,
                   imaging::Bytes* out) {
  const uint64_t need = uint64_t{height} * width * 3;
  if (width == 0 || pixels.size() != need) {
    return Status::Corrupt("pixels: ", pixels.size(), " bytes for ", height, "x", width, "x3 (",
                           need, " expected)");
  }
  const std::string header =
      "P6\n" + std::to_string(width) + " " + std::to_string(height) + "\n255\n";
  out->resize(header.size() + pixels.size());
  std::memcpy(out->data(), header.data(), header.size());
  std::memcpy(out->data() + header.size(), pixels.data(), pixels.size());
  return Status::OK();
}

// The codecs records are made with: one for every file, or (encoding auto) JPEG inputs kept by
// the JPEG codec and every other input stored lossless by the zstd codec.
struct RecordCodecs {
  const codec::Codec* all = nullptr;  // null with encoding auto
  const codec::Codec* jpeg = nullptr;
  const codec::Codec* other = nullptr;
};

Result<RecordCodecs> CodecsFor(format::Encoding encoding) {
  RecordCodecs codecs;
  SF_ASSIGN_OR_RETURN(codecs.jpeg, codec::CodecFor(format::Encoding::kJpeg));
  SF_ASSIGN_OR_RETURN(codecs.other, codec::CodecFor(format::Encoding::kZstd));
  if (encoding != format::Encoding::kAuto) {
    SF_ASSIGN_OR_RETURN(codecs.all, codec::CodecFor(encoding));
  }
  return codecs;
}

struct Prepared {
  Status status;        // the image could not be made into a record (a bad image)
  Status field_status;  // a field value does not match the schema (a bad sample)
  IndexEntry entry{};
  imaging::Bytes payload;
  uint64_t source_bytes = 0;
  bool resized = false;        // re-encoded smaller (PackOptions::size with jpeg)
  bool reencoded = false;      // the record does not hold the source file's bytes
  bool frame_guessed = false;  // Sample::frame_from_size could not tell the boxes' frame
};

// Checks every field but the image and the class field against the schema and the record's
// stored shape.
Status CheckFields(const format::Schema& schema, const Sample& s, const IndexEntry& e) {
  const auto& fields = schema.fields();
  if (s.values.empty()) {
    for (size_t f = 0; f < fields.size(); ++f) {
      if (int(f) != schema.image_field() && int(f) != schema.label_field()) {
        return Status::InvalidArgument("field '", fields[f].name, "': missing");
      }
    }
    return Status::OK();
  }
  if (s.values.size() != fields.size()) {
    return Status::InvalidArgument(s.values.size(), " values for a schema of ", fields.size(),
                                   " fields");
  }
  for (size_t f = 0; f < fields.size(); ++f) {
    if (int(f) == schema.image_field() || int(f) == schema.label_field()) continue;
    int64_t box_rows = -1;
    if (!fields[f].per.empty()) {
      const int b = schema.Find(fields[f].per);
      if (b >= 0 && s.values[b].present && s.values[b].ndim > 0) box_rows = s.values[b].dims[0];
    }
    SF_RETURN_IF_ERROR(
        format::CheckValue(fields[f], s.values[f].view(), e.height, e.width, box_rows));
  }
  return Status::OK();
}

// Lets `edit(b, n)` change each present boxes value of the sample as n x 4 floats, copied out
// and back (a value's bytes need not be float-aligned). A value of the wrong shape is skipped:
// CheckFields says what is wrong with it.
template <typename Edit>
void EditBoxes(const format::Schema& schema, Sample* s, Edit edit) {
  std::vector<float> b;
  for (size_t f = 0; f < s->values.size() && f < schema.size(); ++f) {
    OwnedValue& v = s->values[f];
    if (schema.fields()[f].kind != format::FieldKind::kBoxes || !v.present || v.ndim != 2) continue;
    const size_t n = v.dims[0];
    if (n == 0 || v.bytes.size() != n * 4 * sizeof(float)) continue;  // none: no null memcpy
    b.resize(n * 4);
    std::memcpy(b.data(), v.bytes.data(), v.bytes.size());
    edit(b.data(), n);
    std::memcpy(v.bytes.data(), b.data(), v.bytes.size());
  }
}

// Boxes and masks are given in the source image's pixels (as stored, before EXIF orientation).
// When the codec made the record's pixels anew (turned upright, resized, cropped: `r`), they
// follow the image into the record's frame (`e`): boxes mapped corner by corner (and, with a
// crop, clamped to it: a box outside it keeps its row as a zero-area box, so per-box fields stay
// aligned), masks turned and resampled nearest-neighbour (class ids are never blended).
Status FollowImage(const format::Schema& schema, const codec::Reshape& r, const IndexEntry& e,
                   Sample* s) {
  const uint32_t uw = r.upright_width(), uh = r.upright_height();
  if (uw == 0 || uh == 0 || r.crop_width == 0 || r.crop_height == 0) {
    return Status::Internal("the codec did not say how it made the record");
  }
  const bool cropped = r.crop_width != r.via_width || r.crop_height != r.via_height;
  const double sx = double(r.via_width) / uw, sy = double(r.via_height) / uh;
  const double ox = double(e.width) / r.crop_width, oy = double(e.height) / r.crop_height;
  EditBoxes(schema, s, [&](float* b, size_t n) {
    imaging::OrientBoxes(b, n, r.source_width, r.source_height, r.orientation);
    for (size_t i = 0; i < n * 4; ++i) {
      const bool is_x = i % 2 == 0;
      double c = b[i] * (is_x ? sx : sy) - (is_x ? r.crop_x : r.crop_y);
      if (cropped) c = std::clamp(c, 0.0, double(is_x ? r.crop_width : r.crop_height));
      b[i] = static_cast<float>(c * (is_x ? ox : oy));
    }
  });
  for (size_t f = 0; f < s->values.size() && f < schema.size(); ++f) {
    const format::FieldSpec& spec = schema.fields()[f];
    OwnedValue& v = s->values[f];
    if (!v.present || v.ndim != 2) continue;
    if (spec.kind == format::FieldKind::kMask) {
      if (v.dims[0] != r.source_height || v.dims[1] != r.source_width) {
        return Status::InvalidArgument("field '", spec.name, "': mask is ", v.dims[0], "x",
                                       v.dims[1], ", the image is ", r.source_height, "x",
                                       r.source_width, " (masks are in the source image's pixels)");
      }
      imaging::Image upright;
      upright.Resize(r.source_width, r.source_height, 1);
      if (v.bytes.size() != upright.pixels.size()) continue;
      std::memcpy(upright.pixels.data(), v.bytes.data(), v.bytes.size());
      imaging::ApplyOrientation(&upright, r.orientation);
      std::vector<uint8_t> out(size_t{e.width} * e.height);
      for (uint32_t y = 0; y < e.height; ++y) {
        const double vy = r.crop_y + (y + 0.5) * r.crop_height / e.height;
        const uint32_t uy =
            std::min<uint32_t>(uh - 1, static_cast<uint32_t>(vy * uh / r.via_height));
        for (uint32_t x = 0; x < e.width; ++x) {
          const double vx = r.crop_x + (x + 0.5) * r.crop_width / e.width;
          const uint32_t ux =
              std::min<uint32_t>(uw - 1, static_cast<uint32_t>(vx * uw / r.via_width));
          out[size_t{y} * e.width + x] = upright.pixels[size_t{uy} * uw + ux];
        }
      }
      v = OwnedValue::Array(out.data(), out.size(), {e.height, e.width});
    }
  }
  return Status::OK();
}

// The sample's declared size (Sample::declared_width) against its source image (stored
// `width` x `height`, EXIF `orientation`): boxes drawn on the upright image (declared upright
// size, orientation 5..8) are turned back into the stored frame; another size is an error.
Status CheckDeclaredSize(const format::Schema& schema, uint32_t width, uint32_t height,
                         int orientation, Sample* s, bool* guessed) {
  size_t boxes = 0;  // an image without boxes has no frame to get wrong
  EditBoxes(schema, s, [&](float*, size_t n) { boxes += n; });
  if (boxes == 0) return Status::OK();
  const bool turned = orientation >= 5 && orientation <= 8;
  // Only a turn that changes the shape tells the frames apart by size.
  *guessed = s->frame_from_size && orientation > 1 &&
             (s->declared_width == 0 || !turned || width == height);
  if (s->declared_width == 0 || (s->declared_width == width && s->declared_height == height)) {
    return Status::OK();
  }
  if (!turned || s->declared_width != height || s->declared_height != width) {
    return Status::InvalidArgument(
        "the annotations say the image is ", s->declared_width, "x", s->declared_height,
        " (width x height), the file is ", width, "x", height, turned ? " (upright: " : "",
        turned ? std::to_string(height) + "x" + std::to_string(width) + ")" : "",
        ": its boxes' frame is unknown");
  }
  // Upright -> stored: the inverse orientation, on the upright image's size (6 and 8 are each
  // other's inverse; 5 and 7 their own).
  const int inverse = orientation == 6 ? 8 : orientation == 8 ? 6 : orientation;
  EditBoxes(schema, s,
            [&](float* b, size_t n) { imaging::OrientBoxes(b, n, height, width, inverse); });
  return Status::OK();
}

// Boxes as given: finite, x0 <= x1, y0 <= y1 (format::CheckValue), checked before they move with
// the image (turning sorts each box's corners and a crop clamps them: a bad box would come out
// looking good, and be refused or not depending on the encoding and the photo's orientation).
Status CheckBoxesAsGiven(const format::Schema& schema, const Sample& s, const IndexEntry& e) {
  for (size_t f = 0; f < s.values.size() && f < schema.size(); ++f) {
    if (schema.fields()[f].kind != format::FieldKind::kBoxes || !s.values[f].present) continue;
    SF_RETURN_IF_ERROR(
        format::CheckValue(schema.fields()[f], s.values[f].view(), e.height, e.width, -1));
  }
  return Status::OK();
}

// Makes the sample's record: reads or takes its image, lets the encoding's codec make the record
// of it, then checks its fields (boxes in the declared frame, and boxes and masks moved with the
// image: CheckDeclaredSize, FollowImage).
void PrepareSample(codec::Context& ctx, const RecordCodecs& codecs, const codec::EncodeOptions& opt,
                   const format::Schema& schema, Sample& s, Prepared* out) {
  out->status = out->field_status = Status::OK();
  out->resized = false;
  out->frame_guessed = false;           // the slot is reused: set only where boxes are checked
  imaging::Bytes& file = out->payload;  // the image lands in the payload buffer: no copy
  if (!s.image_file.empty()) {
    out->status = ReadImageFile(s.image_file, s.offset, s.length, &file);
  } else if (s.height > 0) {
    out->status = PixelsToPpm(s.image, s.height, s.width, &file);
  } else {
    file.swap(s.image);
    if (imaging::SniffFormat(file.data(), file.size()) == imaging::ImageFormat::kUnknown) {
      out->status = file.empty() ? Status::Corrupt("empty image")
                                 : Status::Unsupported("not an image (unrecognised signature)");
    }
  }
  if (!out->status.ok()) return;
  out->source_bytes = s.height > 0 ? s.image.size() : file.size();
  const bool jpeg_input =
      imaging::SniffFormat(file.data(), file.size()) == imaging::ImageFormat::kJpeg;
  const codec::Codec& codec = codecs.all ? *codecs.all : jpeg_input ? *codecs.jpeg : *codecs.other;
  IndexEntry& e = out->entry;
  e = IndexEntry{};
  if (schema.label_field() >= 0) {
    if (Status id = CheckClassId(s.label); !id.ok()) {
      out->field_status = id.WithContext("field 'label'");
      return;
    }
    e.label = static_cast<int32_t>(s.label);
  }
  e.encoding = static_cast<uint8_t>(codec.encoding());
  e.orientation = 1;
  out->status = codec.Encode(ctx, opt, &file, &e, &out->resized);
  out->reencoded = !(codec.encoding() == format::Encoding::kJpeg && jpeg_input && !out->resized);
  if (!out->status.ok()) return;
  const codec::Reshape& r = ctx.reshape;
  out->field_status = CheckBoxesAsGiven(schema, s, e);
  if (!out->field_status.ok()) return;
  out->field_status =
      r.kept ? CheckDeclaredSize(schema, e.width, e.height, e.orientation, &s, &out->frame_guessed)
             : CheckDeclaredSize(schema, r.source_width, r.source_height, r.orientation, &s,
                                 &out->frame_guessed);
  if (out->field_status.ok() && !r.kept) out->field_status = FollowImage(schema, r, e, &s);
  if (out->field_status.ok()) out->field_status = CheckFields(schema, s, e);
}

bool OnlyImageAndLabel(const format::Schema& schema) {
  return schema.size() == (schema.label_field() >= 0 ? 2u : 1u);
}

}  // namespace

class SampleWriter::Impl {
 public:
  ~Impl() { StopWorkers(); }

  Status Start(const std::string& out_path, const PackOptions& opts);
  Status Write(Sample sample);
  Status Finish(format::Manifest manifest, bool allow_empty, bool numbered_classes);

  PackResult result;
  ProgressFn progress;

 private:
  struct Slot {
    Sample sample;
    Prepared prepared;
  };
  Status WriteNext();  // appends the oldest queued sample (waiting for its worker)
  Status Append(Slot& slot);
  void Work();
  void StopWorkers();

  std::string out_;
  uint64_t frame_guesses_ = 0;  // samples appended with Prepared::frame_guessed
  int64_t max_label_packed_ = -1;
  std::string first_frame_guess_;
  PackOptions options_;
  format::Schema schema_;
  RecordCodecs codecs_;
  codec::EncodeOptions encode_;
  const codec::Codec* record_codec_ = nullptr;  // the fixed codec (not auto)
  uint32_t fixed_side_ = 0;
  std::unique_ptr<format::ArchiveWriter> writer_;
  format::FieldValues views_;
  Status failure_;
  bool finished_ = false;
  std::chrono::steady_clock::time_point start_, last_progress_;

  // The window of queued samples: [next_write_, next_submit_) are queued, workers claim them in
  // order from next_claim_; slot i % window holds sample i. Guarded by mu_.
  size_t window_ = 0;
  std::vector<Slot> slots_;
  std::vector<char> ready_;
  std::mutex mu_;
  std::condition_variable cv_ready_, cv_work_;
  uint64_t next_submit_ = 0, next_claim_ = 0, next_write_ = 0;
  // Bytes held by prepared-but-unwritten records. Past the budget only the record the writer
  // waits for may be prepared, so a source of huge images cannot take the memory.
  static constexpr uint64_t kPendingBudget = uint64_t{1} << 30;
  uint64_t pending_bytes_ = 0;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

Status SampleWriter::Impl::Start(const std::string& out_path, const PackOptions& opts) {
  out_ = out_path;
  options_ = opts;
  result.output = out_path;
  result.encoding = opts.encoding;
  SF_RETURN_IF_ERROR(ValidatePackOptions(options_));
  if (options_.encoding == Encoding::kAuto && options_.size > 0) {
    // A resolution cap is the JPEG encoding's (resized images are re-encoded as JPEG): with a
    // size, auto packs as jpeg, as pack did before auto existed.
    options_.encoding = Encoding::kJpeg;
    result.encoding = Encoding::kJpeg;
  }
  schema_ = options_.writer.schema;
  if (schema_.image_field() < 0) return Status::InvalidArgument("the schema has no image field");
  format::WriterOptions writer_options = options_.writer;
  writer_options.encoding = options_.encoding;
  writer_options.zstd_level = options_.level;
  const bool auto_encoding = options_.encoding == Encoding::kAuto;
  SF_ASSIGN_OR_RETURN(codecs_, CodecsFor(options_.encoding));
  record_codec_ = auto_encoding ? nullptr : codecs_.all;
  encode_ = EncodeOptionsOf(options_);
  if (record_codec_ && record_codec_->FixedShape(encode_, &fixed_side_)) {
    writer_options.height = writer_options.width = fixed_side_;
  }
  SF_ASSIGN_OR_RETURN(writer_, format::ArchiveWriter::Create(out_, writer_options));
  start_ = last_progress_ = std::chrono::steady_clock::now();
  const int workers = options_.workers > 0 ? options_.workers : AvailableCpus();
  window_ = static_cast<size_t>(workers) * 16;
  slots_.resize(window_);
  ready_.assign(window_, 0);
  for (int t = 0; t < workers; ++t) threads_.emplace_back([this] { Work(); });
  return Status::OK();
}

void SampleWriter::Impl::Work() {
  codec::Context ctx;
  for (;;) {
    uint64_t i;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_work_.wait(lock, [&] {
        return stop_ || (next_claim_ < next_submit_ &&
                         (pending_bytes_ < kPendingBudget || next_claim_ == next_write_));
      });
      if (stop_) return;
      i = next_claim_++;
    }
    Slot& slot = slots_[i % window_];
    PrepareSample(ctx, codecs_, encode_, schema_, slot.sample, &slot.prepared);
    {
      std::lock_guard<std::mutex> lock(mu_);
      ready_[i % window_] = 1;
      pending_bytes_ += slot.prepared.payload.capacity();
    }
    cv_ready_.notify_all();
  }
}

void SampleWriter::Impl::StopWorkers() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_work_.notify_all();
  for (auto& t : threads_) t.join();
  threads_.clear();
}

// Appends a prepared record (or records why its sample was skipped) and counts it. The error
// that ends the writer: the archive writer's, a bad sample without skip_bad, or a skip under
// strict.
Status SampleWriter::Impl::Append(Slot& slot) {
  const Prepared& p = slot.prepared;
  const std::string& name = slot.sample.name;
  PackStats& stats = result.stats;
  ++stats.done;
  const bool bad_image = !p.status.ok();
  if (bad_image || !p.field_status.ok()) {
    const Status& why = bad_image ? p.status : p.field_status;
    if (!bad_image && !options_.skip_bad) {
      result.failed_sample = name;
      return Status::InvalidArgument(name, ": ", why.message());
    }
    result.skipped.push_back({name, why.message()});
    if (!options_.strict) return Status::OK();
    result.failed_sample = name;
    return Status(why.code(), name + ": " + why.message() + " (--strict: no archive written)");
  }
  Status s;
  if (OnlyImageAndLabel(schema_)) {
    s = writer_->Append(p.entry, p.payload.data(), p.payload.size());
  } else {
    views_.resize(schema_.size());
    for (size_t f = 0; f < views_.size(); ++f) {
      views_[f] =
          f < slot.sample.values.size() ? slot.sample.values[f].view() : format::FieldValue{};
    }
    s = writer_->Append(p.entry, p.payload.data(), p.payload.size(), views_);
    if (s.code() == StatusCode::kInvalidArgument) {  // a value the writer's own check refused
      result.failed_sample = name;
      return Status::InvalidArgument(name, ": ", s.message());
    }
  }
  if (!s.ok()) return s.WithContext(out_);
  ++stats.packed;
  if (schema_.label_field() >= 0) {
    max_label_packed_ = std::max<int64_t>(max_label_packed_, p.entry.label);
  }
  if (p.frame_guessed && frame_guesses_++ == 0) first_frame_guess_ = name;
  stats.resized += p.resized;
  stats.reencoded += p.reencoded;
  stats.source_bytes += p.source_bytes;
  stats.payload_bytes += p.payload.size();
  return Status::OK();
}

Status SampleWriter::Impl::WriteNext() {
  const size_t at = next_write_ % window_;
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_ready_.wait(lock, [&] { return ready_[at] != 0; });
  }
  Slot& slot = slots_[at];
  Status s = Append(slot);
  {
    std::lock_guard<std::mutex> lock(mu_);
    pending_bytes_ -= slot.prepared.payload.capacity();
    // A slot keeps its buffer for the next record, unless one huge image left it oversized.
    if (slot.prepared.payload.capacity() > (uint64_t{64} << 20)) {
      imaging::Bytes().swap(slot.prepared.payload);
    }
    slot.sample = Sample();
    ready_[at] = 0;
    ++next_write_;
  }
  cv_work_.notify_all();
  auto now = std::chrono::steady_clock::now();
  if (progress && now - last_progress_ > std::chrono::milliseconds(100)) {
    result.stats.seconds = std::chrono::duration<double>(now - start_).count();
    progress(result.stats);
    last_progress_ = now;
  }
  return s;
}

Status SampleWriter::Impl::Write(Sample sample) {
  if (finished_) return Status::InvalidArgument("write after finish");
  if (!failure_.ok()) return failure_;
  if (sample.name.empty()) {
    sample.name =
        sample.image_file.empty() ? "sample " + std::to_string(next_submit_) : sample.image_file;
  }
  ++result.stats.total;
  while (next_submit_ >= next_write_ + window_) {
    failure_ = WriteNext();
    if (!failure_.ok()) return failure_;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    slots_[next_submit_ % window_].sample = std::move(sample);
    ++next_submit_;
  }
  cv_work_.notify_one();
  return Status::OK();
}

Status SampleWriter::Impl::Finish(format::Manifest manifest, bool allow_empty,
                                  bool numbered_classes) {
  if (finished_) return Status::InvalidArgument("finish called twice");
  finished_ = true;
  while (failure_.ok() && next_write_ < next_submit_) failure_ = WriteNext();
  StopWorkers();
  PackStats& stats = result.stats;
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  if (!failure_.ok()) return failure_;  // the writer's destructor removes the partial output
  if (stats.packed == 0 && !(allow_empty && stats.total == 0)) {
    if (result.skipped.empty()) {
      return failure_ = Status::InvalidArgument("no samples to write; no archive written");
    }
    // Bad data, not bad arguments: every sample was skipped (the CLI exits 1).
    return failure_ = Status::Corrupt("no image could be packed (", result.skipped.size(),
                                      " samples skipped); no archive written");
  }
  manifest.encoding = options_.encoding;
  manifest.schema = schema_;
  if (fixed_side_ > 0) {
    manifest.height = manifest.width = fixed_side_;
    manifest.channels = 3;
  }
  manifest.source_bytes = stats.source_bytes;
  manifest.reencoded_records = stats.reencoded;
  if (record_codec_ && record_codec_->CapsResolution(encode_)) {
    manifest.resized_records = stats.resized;
  }
  manifest.created_by = "shardfeed " SHARDFEED_VERSION;
  if (numbered_classes && schema_.label_field() >= 0) {
    manifest.class_names = NumericClassNames(max_label_packed_);
  }
  if (frame_guesses_ > 0) {
    result.notes.push_back(
        std::to_string(frame_guesses_) +
        " samples with boxes have an EXIF orientation that their annotations' width/height "
        "cannot tell apart from the stored frame (no size given, a mirror or half turn, or a "
        "square image; first: " +
        first_frame_guess_ +
        "): their boxes were taken as drawn on the stored pixels, before the EXIF turn");
  }
  failure_ = writer_->Finish(std::move(manifest));
  if (failure_.ok() && progress) progress(stats);
  return failure_;
}

SampleWriter::SampleWriter(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
SampleWriter::~SampleWriter() = default;

Result<std::unique_ptr<SampleWriter>> SampleWriter::Create(const std::string& out,
                                                           const PackOptions& options) {
  auto impl = std::make_unique<Impl>();
  SF_RETURN_IF_ERROR(impl->Start(out, options));
  return std::unique_ptr<SampleWriter>(new SampleWriter(std::move(impl)));
}

Status SampleWriter::Write(Sample sample) { return impl_->Write(std::move(sample)); }

Status SampleWriter::Finish(format::Manifest manifest, bool allow_empty, bool numbered_classes) {
  return impl_->Finish(std::move(manifest), allow_empty, numbered_classes);
}

const PackResult& SampleWriter::result() const { return impl_->result; }
void SampleWriter::set_progress(ProgressFn progress) { impl_->progress = std::move(progress); }

}  // namespace shardfeed::converter
