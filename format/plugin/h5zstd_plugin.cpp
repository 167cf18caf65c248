// An HDF5 dynamic filter plugin exposing shardfeed's zstd filter (id 32015), so h5dump, h5py and
// other HDF5 tools read zstd archives with HDF5_PLUGIN_PATH pointing at this library's folder.
#include <H5PLextern.h>

#include "../src/hdf5_zstd_filter.h"

extern "C" {
H5PL_type_t H5PLget_plugin_type(void) { return H5PL_TYPE_FILTER; }
const void* H5PLget_plugin_info(void) { return shardfeed::format::ZstdFilterClass(); }
}
