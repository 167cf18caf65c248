// The Zstandard HDF5 filter, registered id 32015 (the id used by the HDF5 plugin collections,
// e.g. hdf5plugin and HDFGroup/hdf5_plugins): a chunk is one plain zstd frame; cd_values[0],
// when present, is the compression level. shardfeed's own implementation, for writing (and for
// reading through the HDF5 API in tools and tests; shardfeed's reader bypasses HDF5).
#pragma once

#include <hdf5.h>

namespace shardfeed::format {

inline constexpr H5Z_filter_t kZstdFilterId = 32015;

// The filter class (H5Zregister takes it; the plugin entry points return it).
const H5Z_class2_t* ZstdFilterClass();

// Registers the filter with this process's HDF5 library if it is not available yet.
herr_t RegisterZstdFilter();

}  // namespace shardfeed::format
