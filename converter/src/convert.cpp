#include "shardfeed/converter/convert.h"

#include <nlohmann/json.hpp>

#include "shardfeed/codec/codec.h"
#include "shardfeed/converter/options.h"
#include "shardfeed/imaging/image.h"

namespace shardfeed::converter {

using nlohmann::json;

namespace {

// Appends a record with the same field values as sample i of `archive` (read through
// Archive::Field, masks decoded: the writer takes pixels), or alone for a legacy schema.
class FieldCopier {
 public:
  explicit FieldCopier(const format::Archive& archive) : archive_(archive) {
    // Masks are bounded as a decode is: by the packer's max_pixels where the archive records a
    // larger one (pack --max-pixels), so what was packed converts.
    const json opts = json::parse(archive.manifest().options_json, nullptr, false);
    if (opts.is_object() && opts.contains("max_pixels") &&
        opts["max_pixels"].is_number_unsigned()) {
      max_pixels_ = std::max(max_pixels_, opts["max_pixels"].get<uint64_t>());
    }
  }

  Status Append(format::ArchiveWriter& writer, uint64_t i, const format::IndexEntry& entry,
                const uint8_t* data, size_t size) {
    const format::Schema& schema = archive_.schema();
    if (schema.size() == 1 + (schema.label_field() >= 0)) return writer.Append(entry, data, size);
    values_.assign(schema.size(), format::FieldValue{});
    masks_.resize(schema.size());
    for (size_t f = 0; f < schema.size(); ++f) {
      if (static_cast<int>(f) == schema.image_field() ||
          static_cast<int>(f) == schema.label_field()) {
        continue;
      }
      // VerifyRecord(i) checked the var blob already.
      SF_ASSIGN_OR_RETURN(format::FieldView v, archive_.Field(i, f, /*verify=*/false));
      format::FieldValue& out = values_[f];
      out.present = true;
      out.data = v.data;
      out.size = v.size;
      out.dims = v.dims;
      out.ndim = v.ndim;
      if (schema.fields()[f].kind == format::FieldKind::kMask) {
        // Bounded as a decode is (a crafted entry and mask of 65535 x 65535 allocated 4 GiB
        // from a 130 KB frame); the writer checks the mask's dims against the entry's.
        SF_RETURN_IF_ERROR(format::CheckPixelLimit(entry, max_pixels_)
                               .WithContext(archive_.path() + ": sample " + std::to_string(i)));
        masks_[f].resize(size_t{v.dims[0]} * v.dims[1]);
        SF_RETURN_IF_ERROR(format::DecodeMask(v, masks_[f].data())
                               .WithContext(archive_.path() + ": sample " + std::to_string(i) +
                                            ": field '" + schema.fields()[f].name + "'"));
        out.data = masks_[f].data();
        out.size = masks_[f].size();
      }
    }
    Status st = writer.Append(entry, data, size, values_);
    // A value the writer refuses came from the archive: its damage (exit 3, as extract), not a
    // wrong argument.
    if (st.code() == StatusCode::kInvalidArgument) st = Status::Corrupt(st.message());
    return st.WithContext(archive_.path() + ": sample " + std::to_string(i));
  }

 private:
  const format::Archive& archive_;
  uint64_t max_pixels_ = imaging::Limits().max_pixels;
  format::FieldValues values_;
  std::vector<std::vector<uint8_t>> masks_;
};

}  // namespace

Result<ConvertTarget> ResolveConvertTarget(const format::Archive& archive,
                                           const std::string& backend,
                                           const std::string& jpeg_layout) {
  ConvertTarget t;
  if (jpeg_layout != "original" && jpeg_layout != "indexed") {
    return Status::InvalidArgument("jpeg_layout (--jpeg-layout) must be original or indexed, not '",
                                   jpeg_layout, "'");
  }
  t.jpeg_indexed = jpeg_layout == "indexed";
  const format::Backend own = archive.manifest().backend;
  if (backend.empty()) {  // a re-layout keeps the container unless asked
    t.backend = t.jpeg_indexed                  ? own
                : own == format::Backend::kLmdb ? format::Backend::kHdf5
                                                : format::Backend::kLmdb;
  } else if (!format::ParseBackend(backend, &t.backend)) {
    return Status::InvalidArgument("backend (--backend) must be lmdb or hdf5, not '", backend, "'");
  }
  return t;
}

Result<uint64_t> Convert(const format::Archive& archive, const std::string& out,
                         format::Backend backend, bool overwrite, bool jpeg_indexed,
                         const CancelToken* cancel) {
  const format::Manifest& m = archive.manifest();
  format::WriterOptions wo;
  wo.backend = backend;
  wo.overwrite = overwrite;
  wo.protect.push_back(archive.path());
  wo.sealed.push_back(archive.path());
  wo.encoding = m.encoding;
  wo.height = m.height;
  wo.width = m.width;
  wo.schema = m.schema;
  wo.inverted_boxes_ok = true;  // an archive written before writers refused them keeps them
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
  // As pack refuses it with raw or zstd: it would change nothing.
  SF_RETURN_IF_ERROR(CheckJpegLayout(jpeg_indexed, m.encoding, archive.path()));
  // What verify checks beyond each record (the index against the shards, var blobs where the
  // writer puts them, the manifest's derived counts): a crafted index that verify refuses is
  // never copied into an archive whose fresh checksums would pass it.
  SF_RETURN_IF_ERROR(archive.VerifyDerived());
  SF_ASSIGN_OR_RETURN(auto writer, format::ArchiveWriter::Create(out, wo));
  // --jpeg-layout indexed: the JPEG codec's own pack-time re-layout, on the stored bytes.
  // An auto archive's JPEG records are re-laid too; its pixel records are copied as they are.
  const bool relayout = jpeg_indexed && (m.encoding == format::Encoding::kJpeg ||
                                         m.encoding == format::Encoding::kAuto);
  SF_ASSIGN_OR_RETURN(const codec::Codec* jpeg, codec::CodecFor(format::Encoding::kJpeg));
  codec::EncodeOptions encode;
  encode.jpeg_indexed = true;
  encode.validation = codec::Validation::kNone;  // the records were checked when packed
  codec::Context ctx;
  imaging::Bytes payload;
  FieldCopier fields(archive);
  size_t shard = 0;
  for (uint64_t i = 0; i < archive.size(); ++i) {
    while (shard + 1 < m.shards.size() && i >= m.shards[shard + 1].first_sample) {
      ++shard;
      SF_RETURN_IF_ERROR(writer->NextShard());
    }
    if (Cancelled(cancel)) return Status::Cancelled(archive.path(), ": convert cancelled");
    SF_RETURN_IF_ERROR(archive.VerifyRecord(i));  // never copy damage into a fresh checksum
    SF_ASSIGN_OR_RETURN(format::RecordView r, archive.At(i));
    if (relayout && r.entry->encoding == static_cast<uint8_t>(format::Encoding::kJpeg) &&
        !(r.entry->flags & format::kFlagJpegIndexed)) {
      payload.assign(r.data, r.data + r.size);
      format::IndexEntry fresh{};
      bool resized = false;
      SF_RETURN_IF_ERROR(jpeg->Encode(ctx, encode, &payload, &fresh, &resized)
                             .WithContext(archive.path() + ": sample " + std::to_string(i)));
      format::IndexEntry e = *r.entry;
      e.flags = fresh.flags;
      SF_RETURN_IF_ERROR(fields.Append(*writer, i, e, payload.data(), payload.size()));
      continue;
    }
    SF_RETURN_IF_ERROR(fields.Append(*writer, i, *r.entry, r.data, r.size));
  }
  format::Manifest copy = format::SameRecordsAs(m);
  // The recorded options say what the archive now is: its backend, and its layout when re-laid.
  if (json j = json::parse(m.options_json, nullptr, false); j.is_object()) {
    if (j.contains("backend")) j["backend"] = format::BackendName(backend);
    if (relayout) j["jpeg_layout"] = "indexed";
    copy.options_json = j.dump();
  } else if (relayout) {
    copy.options_json = json{{"jpeg_layout", "indexed"}}.dump();
  }
  // A part of a split pack stays one: the same samples, so merge joins converted parts (it
  // refuses parts whose recorded options now differ).
  copy.is_part = m.is_part;
  copy.part = m.part;
  copy.source_bytes = m.source_bytes;
  copy.created_by = "shardfeed " SHARDFEED_VERSION " (converted from " +
                    std::string(format::BackendName(m.backend)) + ")";
  SF_RETURN_IF_ERROR(writer->Finish(std::move(copy)));
  return archive.size();
}

}  // namespace shardfeed::converter
