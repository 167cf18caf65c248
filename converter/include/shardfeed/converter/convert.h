// convert: an archive rewritten into the other backend (LMDB <-> HDF5), records unchanged.
#pragma once

#include <cstdint>
#include <string>

#include "shardfeed/base/cancel.h"
#include "shardfeed/base/status.h"
#include "shardfeed/format/archive.h"

namespace shardfeed::converter {

// What `convert`'s backend and jpeg_layout texts (CLI --backend/--jpeg-layout, Python's
// keywords) mean for `archive`: backend "" is the one it does not use, or with layout "indexed"
// its own; layout "original" or "indexed". kInvalidArgument naming the option otherwise.
struct ConvertTarget {
  format::Backend backend = format::Backend::kLmdb;
  bool jpeg_indexed = false;
};
Result<ConvertTarget> ResolveConvertTarget(const format::Archive& archive,
                                           const std::string& backend,
                                           const std::string& jpeg_layout);

// Rewrites an archive into another backend without decoding anything: the same records, labels,
// shards (sample ranges) and checksums. Writes as format::ArchiveWriter does (atomically, never
// replacing what is not an archive; `overwrite` to replace one). Returns the number of records
// written. First runs verify's checks beyond the records (Archive::VerifyDerived: the index,
// var blob placement, the manifest's derived counts), then each record's checksum as it is
// copied: a failure is an error (damage is never copied into a fresh checksum). A part of a
// split pack stays one (its "part"); the recorded options name the new backend. With
// `jpeg_indexed`, the JPEG records not yet indexed are re-laid as `pack --jpeg-layout indexed` does
// (losslessly, from the stored bytes; their checksums are new).
// `cancel` (may be null) ends the copy between records with kCancelled, OUT untouched.
Result<uint64_t> Convert(const format::Archive& archive, const std::string& out,
                         format::Backend backend, bool overwrite = false, bool jpeg_indexed = false,
                         const CancelToken* cancel = nullptr);

}  // namespace shardfeed::converter
