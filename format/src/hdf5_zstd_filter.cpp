#include "hdf5_zstd_filter.h"

#include <zstd.h>

#include <cstdlib>

namespace shardfeed::format {
namespace {

// HDF5 filter callback: compresses or decompresses *buf (nbytes valid of *buf_size allocated)
// in place by swapping in a new H5allocate'd buffer. Returns the new valid size, 0 on failure.
size_t ZstdFilter(unsigned flags, size_t cd_nelmts, const unsigned cd_values[], size_t nbytes,
                  size_t* buf_size, void** buf) {
  if (flags & H5Z_FLAG_REVERSE) {
    unsigned long long size = ZSTD_getFrameContentSize(*buf, nbytes);
    if (size == ZSTD_CONTENTSIZE_ERROR || size == ZSTD_CONTENTSIZE_UNKNOWN) return 0;
    void* out = H5allocate_memory(static_cast<size_t>(size), false);
    if (!out) return 0;
    size_t n = ZSTD_decompress(out, static_cast<size_t>(size), *buf, nbytes);
    if (ZSTD_isError(n) || n != size) {
      H5free_memory(out);
      return 0;
    }
    H5free_memory(*buf);
    *buf = out;
    *buf_size = static_cast<size_t>(size);
    return n;
  }
  int level = cd_nelmts > 0 ? static_cast<int>(cd_values[0]) : 1;
  size_t bound = ZSTD_compressBound(nbytes);
  void* out = H5allocate_memory(bound, false);
  if (!out) return 0;
  size_t n = ZSTD_compress(out, bound, *buf, nbytes, level);
  if (ZSTD_isError(n)) {
    H5free_memory(out);
    return 0;
  }
  H5free_memory(*buf);
  *buf = out;
  *buf_size = bound;
  return n;
}

const H5Z_class2_t kZstdClass = {
    H5Z_CLASS_T_VERS, kZstdFilterId, 1, 1, "zstd (shardfeed)", nullptr, nullptr, ZstdFilter,
};

}  // namespace

const H5Z_class2_t* ZstdFilterClass() { return &kZstdClass; }

herr_t RegisterZstdFilter() {
  if (H5Zfilter_avail(kZstdFilterId) > 0) return 0;
  return H5Zregister(&kZstdClass);
}

}  // namespace shardfeed::format
