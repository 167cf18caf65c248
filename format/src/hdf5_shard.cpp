// HDF5 shard files: standard HDF5 that h5py, h5ls and h5dump read without shardfeed, and a read
// path that uses the HDF5 library only at open. Layout (docs/FORMAT.md, "A shard (HDF5)"):
//   /records          uint8[n*C], chunked by C bytes: logical chunk k fills HDF5 chunks
//                     [first_k, first_k + ceil(size_k / C)), zero-padded (JPEG or variable shape)
//   /images           uint8[N,H,W,3], one HDF5 chunk per sample, zstd filter 32015 for zstd
//                     records (fixed-shape raw/zstd archives; replaces /records)
//   /labels           int64[N]           /shapes  uint16[N,3]
//   /record_offsets   uint64[N]          /record_sizes  uint32[N]   (into /records)
//   /shardfeed/header uint8[64]          /shardfeed/index uint8[N*32]
//   /shardfeed/chunk_sizes uint64[K]     attributes on /: format, format_version, encoding,
//                                        chunk_bytes, manifest (JSON, once the archive is done)
//   /shardfeed/fields uint8[T]           version 4, when the schema has fields (fields table)
//   /shardfeed/var    uint8[V]           version 4, /images shards with variable fields: the var
//                                        stream (every var blob; VarEntry chunk 0, offset into it)
#include <fcntl.h>
#include <hdf5.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <mutex>

#include "hdf5_zstd_filter.h"
#include "shard_internal.h"

namespace shardfeed::format {
namespace {

// The Debian libhdf5 is built without thread safety: every HDF5 call in this process goes
// through this lock. Only opening and writing call HDF5; reading records never does.
std::mutex& Hdf5Lock() {
  static std::mutex mu;
  return mu;
}

void QuietHdf5() {
  static std::once_flag once;
  std::call_once(once, [] {
    // HDF5 1.10 crashes in its atexit handler when a file failed to close (a full disk during
    // writing). Every file we open is closed explicitly, so the handler has nothing to do for
    // us; skipping it is safe. (No effect if another user, e.g. h5py, initialised HDF5 first.)
    H5dont_atexit();
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  });
}

// Closes an HDF5 handle of any kind at scope exit.
class Handle {
 public:
  Handle() = default;
  explicit Handle(hid_t id) : id_(id) {}
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  Handle& operator=(hid_t id) {
    Close();
    id_ = id;
    return *this;
  }
  ~Handle() { Close(); }
  hid_t get() const { return id_; }
  bool ok() const { return id_ >= 0; }
  // Forgets the handle without closing it (it was closed explicitly).
  void Release() { id_ = -1; }
  void Close() {
    if (id_ >= 0) {
      H5I_type_t type = H5Iget_type(id_);
      if (type == H5I_FILE)
        H5Fclose(id_);
      else if (type == H5I_DATASET)
        H5Dclose(id_);
      else if (type == H5I_DATASPACE)
        H5Sclose(id_);
      else if (type == H5I_GROUP)
        H5Gclose(id_);
      else if (type == H5I_ATTR)
        H5Aclose(id_);
      else if (type == H5I_GENPROP_LST)
        H5Pclose(id_);
      else if (type == H5I_DATATYPE)
        H5Tclose(id_);
    }
    id_ = -1;
  }

 private:
  hid_t id_ = -1;
};

// The system error behind the innermost failure on HDF5's error stack: its file drivers record
// "errno = N" in the description of a failed read or write. 0 when there is none.
int SystemErrorOnStack() {
  int found = 0;
  auto walk = [](unsigned, const H5E_error2_t* e, void* data) -> herr_t {
    const char* at = e && e->desc ? std::strstr(e->desc, "errno = ") : nullptr;
    if (at) *static_cast<int*>(data) = std::atoi(at + 8);
    return 0;
  };
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, walk, &found);
  return found;
}

// Names the system error when there is one, so a full disk reads "no space left on device"
// rather than an HDF5 step that "failed".
Status Hdf5Error(const std::string& file, const std::string& what) {
  int err = SystemErrorOnStack();
  if (err == 0 && (errno == ENOSPC || errno == EDQUOT || errno == EFBIG || errno == EIO)) {
    err = errno;
  }
  if (err == ENOSPC) {
    return Status::IOError(file, ": no space left on device (HDF5 ", what, ")");
  }
  if (err != 0) return Status::IOError(file, ": HDF5 ", what, " failed: ", std::strerror(err));
  return Status::IOError(file, ": HDF5 ", what, " failed");
}

Status WriteDataset(hid_t file, const char* name, hid_t type, int rank, const hsize_t* dims,
                    const void* data, const std::string& where) {
  Handle space(H5Screate_simple(rank, dims, nullptr));
  Handle dset(H5Dcreate2(file, name, type, space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
  if (!dset.ok()) return Hdf5Error(where, std::string("create ") + name);
  size_t total = 1;
  for (int i = 0; i < rank; ++i) total *= dims[i];
  if (total > 0 && H5Dwrite(dset.get(), type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) < 0) {
    return Hdf5Error(where, std::string("write ") + name);
  }
  return Status::OK();
}

Status WriteStringAttr(hid_t obj, const char* name, const std::string& value,
                       const std::string& where) {
  Handle type(H5Tcopy(H5T_C_S1));
  H5Tset_size(type.get(), value.empty() ? 1 : value.size());
  H5Tset_cset(type.get(), H5T_CSET_UTF8);
  Handle space(H5Screate(H5S_SCALAR));
  if (H5Aexists(obj, name) > 0) H5Adelete(obj, name);
  Handle attr(H5Acreate2(obj, name, type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT));
  if (!attr.ok() || H5Awrite(attr.get(), type.get(), value.empty() ? "" : value.data()) < 0) {
    return Hdf5Error(where, std::string("write attribute ") + name);
  }
  return Status::OK();
}

Status WriteU64Attr(hid_t obj, const char* name, uint64_t value, const std::string& where) {
  Handle space(H5Screate(H5S_SCALAR));
  Handle attr(H5Acreate2(obj, name, H5T_STD_U64LE, space.get(), H5P_DEFAULT, H5P_DEFAULT));
  if (!attr.ok() || H5Awrite(attr.get(), H5T_NATIVE_UINT64, &value) < 0) {
    return Hdf5Error(where, std::string("write attribute ") + name);
  }
  return Status::OK();
}

// Closes a file explicitly (its errors matter: they are where HDF5 reports failed writes) and
// makes it durable.
Status CloseAndSync(Handle& file_handle, const std::string& file) {
  herr_t rc = H5Fclose(file_handle.get());
  file_handle.Release();
  if (rc < 0) return Hdf5Error(file, "close");
  return SyncPath(file, /*directory=*/false);
}

Result<uint64_t> ReadU64Attr(hid_t obj, const char* name, const std::string& where) {
  if (H5Aexists(obj, name) <= 0) return Status::Corrupt(where, ": missing attribute ", name);
  Handle attr(H5Aopen(obj, name, H5P_DEFAULT));
  uint64_t v = 0;
  if (!attr.ok() || H5Aread(attr.get(), H5T_NATIVE_UINT64, &v) < 0) {
    return Status::Corrupt(where, ": unreadable attribute ", name);
  }
  return v;
}

// Reads a dataset of exactly `dims` (rank 1 or 2) into `out` as `mem_type`: the shape is checked
// before anything is allocated.
template <typename T>
Status ReadShaped(hid_t file, const char* name, hid_t mem_type, const std::vector<hsize_t>& dims,
                  std::vector<T>* out, const std::string& where) {
  if (H5Lexists(file, name, H5P_DEFAULT) <= 0) return Status::Corrupt(where, ": missing ", name);
  Handle dset(H5Dopen2(file, name, H5P_DEFAULT));
  Handle space(dset.ok() ? H5Dget_space(dset.get()) : H5I_INVALID_HID);
  const int rank = space.ok() ? H5Sget_simple_extent_ndims(space.get()) : -1;
  if (rank != static_cast<int>(dims.size())) {
    return Status::Corrupt(where, ": ", name, " is not a ", dims.size(), "-D dataset");
  }
  std::vector<hsize_t> got(dims.size());
  H5Sget_simple_extent_dims(space.get(), got.data(), nullptr);
  if (got != dims) {
    std::string want, have;
    for (size_t d = 0; d < dims.size(); ++d) {
      want += (d ? " x " : "") + std::to_string(dims[d]);
      have += (d ? " x " : "") + std::to_string(got[d]);
    }
    return Status::Corrupt(where, ": ", name, " holds ", have, " elements, expected ", want);
  }
  size_t n = 1;
  for (hsize_t d : dims) n *= d;
  out->resize(n);
  if (n > 0 && H5Dread(dset.get(), mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, out->data()) < 0) {
    return Status::Corrupt(where, ": cannot read ", name);
  }
  return Status::OK();
}

// A 1-D dataset of exactly `expected` elements.
template <typename T>
Status ReadVector(hid_t file, const char* name, hid_t mem_type, std::vector<T>* out,
                  uint64_t expected, const std::string& where) {
  return ReadShaped(file, name, mem_type, {expected}, out, where);
}

constexpr uint64_t kNoOffset = ~uint64_t{0};

// Where a 1-D uint8 dataset lies in the file: its element count, and its file offset when it is
// stored contiguously inside the file (kNoOffset otherwise: read it through HDF5).
struct Placement {
  bool exists = false;
  uint64_t elements = 0;
  uint64_t offset = kNoOffset;
};
Placement Place(hid_t file, const char* name, uint64_t file_bytes) {
  Placement p;
  if (H5Lexists(file, "/shardfeed", H5P_DEFAULT) <= 0 || H5Lexists(file, name, H5P_DEFAULT) <= 0) {
    return p;
  }
  Handle dset(H5Dopen2(file, name, H5P_DEFAULT));
  Handle space(dset.ok() ? H5Dget_space(dset.get()) : -1);
  if (!space.ok() || H5Sget_simple_extent_ndims(space.get()) != 1) return p;
  hsize_t n = 0;
  H5Sget_simple_extent_dims(space.get(), &n, nullptr);
  p.exists = true;
  p.elements = n;
  const haddr_t offset = H5Dget_offset(dset.get());
  if (offset != HADDR_UNDEF && offset <= file_bytes && n <= file_bytes - offset) p.offset = offset;
  return p;
}

class Hdf5Sink : public ArchiveWriter::ShardSink {
 public:
  ~Hdf5Sink() override {
    std::lock_guard<std::mutex> lock(Hdf5Lock());
    data_.Close();
    file_h_.Close();
  }

  Status Open(const std::string& file, const WriterOptions& opt) {
    std::lock_guard<std::mutex> lock(Hdf5Lock());
    QuietHdf5();
    file_ = file;
    images_mode_ = Hdf5ImagesMode(opt);
    chunk_bytes_ = opt.chunk_bytes;
    Handle fapl(H5Pcreate(H5P_FILE_ACCESS));
    // v110 objects: a single unlimited dimension gets an extensible-array chunk index, so
    // looking up one chunk's address is O(1) rather than a B-tree walk.
    H5Pset_libver_bounds(fapl.get(), H5F_LIBVER_V110, H5F_LIBVER_V110);
    file_h_ = H5Fcreate(file.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get());
    if (!file_h_.ok()) return Hdf5Error(file, "create file");
    Handle dcpl(H5Pcreate(H5P_DATASET_CREATE));
    if (images_mode_) {
      dims_[0] = 0, dims_[1] = opt.height, dims_[2] = opt.width, dims_[3] = 3;
      hsize_t max[4] = {H5S_UNLIMITED, dims_[1], dims_[2], 3};
      hsize_t chunk[4] = {1, dims_[1], dims_[2], 3};
      H5Pset_chunk(dcpl.get(), 4, chunk);
      if (opt.encoding == Encoding::kZstd) {
        if (RegisterZstdFilter() < 0) return Hdf5Error(file, "register zstd filter");
        unsigned level = static_cast<unsigned>(opt.zstd_level);
        if (H5Pset_filter(dcpl.get(), kZstdFilterId, H5Z_FLAG_MANDATORY, 1, &level) < 0) {
          return Hdf5Error(file, "set zstd filter");
        }
      }
      Handle space(H5Screate_simple(4, dims_, max));
      data_ = H5Dcreate2(file_h_.get(), "images", H5T_STD_U8LE, space.get(), H5P_DEFAULT,
                         dcpl.get(), H5P_DEFAULT);
    } else {
      hsize_t zero = 0, max = H5S_UNLIMITED, chunk = chunk_bytes_;
      H5Pset_chunk(dcpl.get(), 1, &chunk);
      Handle space(H5Screate_simple(1, &zero, &max));
      data_ = H5Dcreate2(file_h_.get(), "records", H5T_STD_U8LE, space.get(), H5P_DEFAULT,
                         dcpl.get(), H5P_DEFAULT);
    }
    if (!data_.ok()) return Hdf5Error(file, "create data set");
    return Status::OK();
  }

  Status PutChunk(uint32_t number, const uint8_t* data, size_t size) override {
    std::lock_guard<std::mutex> lock(Hdf5Lock());
    chunk_sizes_.push_back(size);
    if (images_mode_) {
      hsize_t extent[4] = {uint64_t{number} + 1, dims_[1], dims_[2], 3};
      hsize_t offset[4] = {number, 0, 0, 0};
      if (H5Dset_extent(data_.get(), extent) < 0 ||
          H5Dwrite_chunk(data_.get(), H5P_DEFAULT, 0, offset, size, data) < 0) {
        return Hdf5Error(file_, "write image chunk " + std::to_string(number));
      }
      chunk_first_.push_back(number);
      return Status::OK();
    }
    // A logical chunk spans whole HDF5 chunks, the last one zero-padded.
    const uint64_t n = (size + chunk_bytes_ - 1) / chunk_bytes_;
    chunk_first_.push_back(next_hdf5_chunk_);
    hsize_t extent = (next_hdf5_chunk_ + n) * chunk_bytes_;
    if (H5Dset_extent(data_.get(), &extent) < 0) return Hdf5Error(file_, "extend records");
    pad_.resize(chunk_bytes_);
    for (uint64_t j = 0; j < n; ++j) {
      const uint64_t begin = j * chunk_bytes_;
      const uint64_t len = std::min<uint64_t>(chunk_bytes_, size - begin);
      const uint8_t* src = data + begin;
      if (len < chunk_bytes_) {
        std::memcpy(pad_.data(), src, len);
        std::memset(pad_.data() + len, 0, chunk_bytes_ - len);
        src = pad_.data();
      }
      hsize_t offset = (next_hdf5_chunk_ + j) * chunk_bytes_;
      if (H5Dwrite_chunk(data_.get(), H5P_DEFAULT, 0, &offset, chunk_bytes_, src) < 0) {
        return Hdf5Error(file_, "write records chunk");
      }
    }
    next_hdf5_chunk_ += n;
    return Status::OK();
  }

  // Kept until Finish (the writer holds the bytes until then), written beside the index.
  Status PutVarStream(const uint8_t* data, size_t size) override {
    if (!images_mode_) return Status::Internal(file_, ": a var stream for a /records shard");
    var_data_ = data;
    var_size_ = size;
    has_var_ = true;
    return Status::OK();
  }

  Status Finish(const ShardHeader& header, const IndexEntry* index, size_t count,
                const uint8_t* fields, size_t fields_size) override {
    std::lock_guard<std::mutex> lock(Hdf5Lock());
    const hid_t f = file_h_.get();
    std::vector<int64_t> labels(count);
    std::vector<uint16_t> shapes(count * 3);
    std::vector<uint64_t> offsets(count);
    std::vector<uint32_t> sizes(count);
    for (size_t i = 0; i < count; ++i) {
      const IndexEntry& e = index[i];
      labels[i] = e.label;
      shapes[3 * i] = e.height;
      shapes[3 * i + 1] = e.width;
      shapes[3 * i + 2] = e.encoding == uint8_t(Encoding::kJpeg) ? e.channels : 3;
      offsets[i] = images_mode_ ? 0 : chunk_first_[e.chunk] * chunk_bytes_ + e.offset;
      sizes[i] = e.size;
    }
    hsize_t n = count, shape_dims[2] = {count, 3}, hdr = sizeof(header),
            idx = count * sizeof(IndexEntry), k = chunk_sizes_.size();
    SF_RETURN_IF_ERROR(WriteDataset(f, "labels", H5T_STD_I64LE, 1, &n, labels.data(), file_));
    SF_RETURN_IF_ERROR(
        WriteDataset(f, "shapes", H5T_STD_U16LE, 2, shape_dims, shapes.data(), file_));
    if (!images_mode_) {
      SF_RETURN_IF_ERROR(
          WriteDataset(f, "record_offsets", H5T_STD_U64LE, 1, &n, offsets.data(), file_));
      SF_RETURN_IF_ERROR(
          WriteDataset(f, "record_sizes", H5T_STD_U32LE, 1, &n, sizes.data(), file_));
    }
    Handle group(H5Gcreate2(f, "shardfeed", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
    if (!group.ok()) return Hdf5Error(file_, "create group shardfeed");
    SF_RETURN_IF_ERROR(WriteDataset(group.get(), "header", H5T_STD_U8LE, 1, &hdr, &header, file_));
    SF_RETURN_IF_ERROR(WriteDataset(group.get(), "index", H5T_STD_U8LE, 1, &idx, index, file_));
    SF_RETURN_IF_ERROR(
        WriteDataset(group.get(), "chunk_sizes", H5T_STD_U64LE, 1, &k, chunk_sizes_.data(), file_));
    if (fields_size > 0) {
      hsize_t t = fields_size;
      SF_RETURN_IF_ERROR(WriteDataset(group.get(), "fields", H5T_STD_U8LE, 1, &t, fields, file_));
    }
    if (has_var_) {
      hsize_t v = var_size_;
      SF_RETURN_IF_ERROR(WriteDataset(group.get(), "var", H5T_STD_U8LE, 1, &v, var_data_, file_));
    }
    SF_RETURN_IF_ERROR(WriteStringAttr(f, "format", "shardfeed", file_));
    SF_RETURN_IF_ERROR(WriteU64Attr(f, "format_version", kFormatVersion, file_));
    SF_RETURN_IF_ERROR(WriteU64Attr(f, "chunk_bytes", images_mode_ ? 0 : chunk_bytes_, file_));
    data_.Close();
    group.Close();
    return CloseAndSync(file_h_, file_);
  }

 private:
  std::string file_;
  Handle file_h_, data_;
  bool images_mode_ = false;
  uint64_t chunk_bytes_ = 0;
  hsize_t dims_[4] = {0, 0, 0, 0};
  uint64_t next_hdf5_chunk_ = 0;
  std::vector<uint64_t> chunk_sizes_, chunk_first_;
  std::vector<uint8_t> pad_;
  bool has_var_ = false;  // PutVarStream was called: write /shardfeed/var
  const uint8_t* var_data_ = nullptr;
  size_t var_size_ = 0;
};

class Hdf5ShardStore : public ShardStore {
 public:
  ~Hdf5ShardStore() override {
    if (map_) ::munmap(map_, map_len_);
  }
  void* map_ = nullptr;
  size_t map_len_ = 0;
  std::vector<IndexEntry> owned_index;
  std::vector<uint64_t> owned_fields;              // the fields table when it could not be mapped
  std::vector<uint8_t> owned_var;                  // the var stream when it could not be mapped
  std::vector<std::vector<uint8_t>> owned_chunks;  // logical chunks whose pieces were not adjacent
};

}  // namespace

Result<std::unique_ptr<ArchiveWriter::ShardSink>> CreateHdf5Sink(const std::string& file,
                                                                 const WriterOptions& options) {
  auto sink = std::make_unique<Hdf5Sink>();
  SF_RETURN_IF_ERROR(sink->Open(file, options));
  return std::unique_ptr<ArchiveWriter::ShardSink>(std::move(sink));
}

Status AnnotateHdf5Shard(const std::string& file, const std::string& manifest_json) {
  std::lock_guard<std::mutex> lock(Hdf5Lock());
  QuietHdf5();
  Handle f(H5Fopen(file.c_str(), H5F_ACC_RDWR, H5P_DEFAULT));
  if (!f.ok()) return Hdf5Error(file, "reopen to annotate");
  SF_RETURN_IF_ERROR(WriteStringAttr(f.get(), "manifest", manifest_json, file));
  return CloseAndSync(f, file);
}

namespace {

// The root attribute `format`, which must be the string "shardfeed".
Status CheckFormatAttr(hid_t f, const std::string& where) {
  if (H5Aexists(f, "format") <= 0) return Status::Corrupt(where, ": missing attribute format");
  Handle attr(H5Aopen(f, "format", H5P_DEFAULT));
  Handle type(attr.ok() ? H5Aget_type(attr.get()) : H5I_INVALID_HID);
  Handle space(attr.ok() ? H5Aget_space(attr.get()) : H5I_INVALID_HID);
  std::string value;
  if (type.ok() && space.ok() && H5Tget_class(type.get()) == H5T_STRING &&
      H5Sget_simple_extent_type(space.get()) == H5S_SCALAR) {
    if (H5Tis_variable_str(type.get()) > 0) {
      Handle mem(H5Tcopy(H5T_C_S1));
      H5Tset_size(mem.get(), H5T_VARIABLE);
      char* text = nullptr;
      if (H5Aread(attr.get(), mem.get(), &text) >= 0 && text) value = text;
      if (text) H5free_memory(text);
    } else if (const size_t size = H5Tget_size(type.get()); size > 0 && size <= 64) {
      value.resize(size);
      if (H5Aread(attr.get(), type.get(), value.data()) < 0) value.clear();
      value.resize(std::strlen(value.c_str()));  // a fixed-size string may be NUL-padded
    }
  }
  if (value != "shardfeed") {
    return Status::Corrupt(where, ": attribute format is not \"shardfeed\"");
  }
  return Status::OK();
}

}  // namespace

Status CheckHdf5Mirrors(const std::string& file, const ShardStore& shard, uint64_t first_sample,
                        const std::string& where) {
  std::lock_guard<std::mutex> lock(Hdf5Lock());
  QuietHdf5();
  Handle f(H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
  if (!f.ok()) return Status::Corrupt(where, ": HDF5 cannot open it");
  SF_RETURN_IF_ERROR(CheckFormatAttr(f.get(), where));
  SF_ASSIGN_OR_RETURN(const uint64_t version, ReadU64Attr(f.get(), "format_version", where));
  if (version != shard.header.format_version) {
    return Status::Corrupt(where, ": attribute format_version is ", version, ", the header's ",
                           shard.header.format_version);
  }
  SF_ASSIGN_OR_RETURN(const uint64_t chunk_bytes, ReadU64Attr(f.get(), "chunk_bytes", where));
  const uint64_t n = shard.header.sample_count;
  std::vector<int64_t> labels;
  std::vector<uint16_t> shapes;
  SF_RETURN_IF_ERROR(ReadShaped(f.get(), "/labels", H5T_NATIVE_INT64, {n}, &labels, where));
  SF_RETURN_IF_ERROR(ReadShaped(f.get(), "/shapes", H5T_NATIVE_UINT16, {n, 3}, &shapes, where));
  std::vector<uint64_t> offsets, first_piece;
  std::vector<uint32_t> sizes;
  if (chunk_bytes > 0) {  // /records: where each record lies in the padded stream
    SF_RETURN_IF_ERROR(
        ReadShaped(f.get(), "/record_offsets", H5T_NATIVE_UINT64, {n}, &offsets, where));
    SF_RETURN_IF_ERROR(ReadShaped(f.get(), "/record_sizes", H5T_NATIVE_UINT32, {n}, &sizes, where));
    uint64_t next = 0;
    for (uint64_t size : shard.chunk_size) {
      first_piece.push_back(next);
      next += (size + chunk_bytes - 1) / chunk_bytes;
    }
  }
  for (uint64_t i = 0; i < n; ++i) {
    const IndexEntry& e = shard.index[i];
    const uint16_t channels = e.encoding == uint8_t(Encoding::kJpeg) ? e.channels : 3;
    const char* differs =
        labels[i] != e.label ? "/labels"
        : shapes[3 * i] != e.height || shapes[3 * i + 1] != e.width || shapes[3 * i + 2] != channels
            ? "/shapes"
        : chunk_bytes == 0 ? nullptr
        : e.chunk >= first_piece.size() ||
                offsets[i] != first_piece[e.chunk] * chunk_bytes + e.offset
            ? "/record_offsets"
        : sizes[i] != e.size ? "/record_sizes"
                             : nullptr;
    if (differs) {
      return Status::Corrupt(where, ": ", differs, " disagrees with the index at sample ",
                             first_sample + i, " (h5py readers would read another value)");
    }
  }
  return Status::OK();
}

// long: phase 1 (HDF5, under its lock) hands phase 2 (the map) a dozen addresses and sizes.
Result<std::unique_ptr<ShardStore>> OpenHdf5Shard(const std::string& file, const ShardInfo& info,
                                                  size_t number) {
  auto store = std::make_unique<Hdf5ShardStore>();
  struct stat st;
  if (::stat(file.c_str(), &st) != 0) return Status::IOError(file, ": ", std::strerror(errno));
  if (!S_ISREG(st.st_mode)) return Status::Corrupt(file, ": not a regular file");
  store->file_bytes = static_cast<uint64_t>(st.st_size);

  // Phase 1, under the HDF5 lock: read the small metadata and every chunk's file address.
  std::vector<uint64_t> chunk_sizes, chunk_addr;
  std::vector<std::vector<uint64_t>> piece_addr;  // records mode: each logical chunk's pieces
  uint64_t index_offset = kNoOffset;   // where the index lies in the file, when it can be mapped
  uint64_t fields_offset = kNoOffset;  // likewise the fields table
  uint64_t var_offset = kNoOffset;     // and the var stream (/images shards)
  uint64_t chunk_bytes = 0;
  {
    std::lock_guard<std::mutex> lock(Hdf5Lock());
    QuietHdf5();
    if (H5Fis_hdf5(file.c_str()) <= 0) return Status::Corrupt(file, ": not an HDF5 file");
    Handle f(H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
    if (!f.ok()) return Status::Corrupt(file, ": HDF5 cannot open it");
    std::vector<uint8_t> header_bytes, index_bytes;
    SF_RETURN_IF_ERROR(ReadVector(f.get(), "/shardfeed/header", H5T_NATIVE_UINT8, &header_bytes,
                                  sizeof(ShardHeader), file));
    std::memcpy(&store->header, header_bytes.data(), sizeof(ShardHeader));
    SF_RETURN_IF_ERROR(CheckShardHeader(store->header, info, number, store->file_bytes, file));
    // The index is read from the mapping when HDF5 stored it contiguously, aligned and inside
    // the file (as our writer does): no private copy, pages shared by every reader of the file.
    const uint64_t index_size = store->header.sample_count * sizeof(IndexEntry);
    {
      const Placement p = Place(f.get(), "/shardfeed/index", store->file_bytes);
      if (p.elements == index_size && p.offset % alignof(IndexEntry) == 0) index_offset = p.offset;
    }
    // Version 4: the fields table, when present (its size is checked by the archive against the
    // schema; one larger than the file cannot be ours).
    const Placement fields = Place(f.get(), "/shardfeed/fields", store->file_bytes);
    if (fields.exists) {
      if (fields.elements > store->file_bytes) {
        return Status::Corrupt(file, ": /shardfeed/fields holds ", fields.elements,
                               " bytes, more than the file");
      }
      store->fields_size = fields.elements;
      if (fields.offset != kNoOffset && fields.offset % 8 == 0) {
        fields_offset = fields.offset;
      } else if (fields.elements > 0) {
        std::vector<uint8_t> bytes;
        SF_RETURN_IF_ERROR(ReadVector(f.get(), "/shardfeed/fields", H5T_NATIVE_UINT8, &bytes,
                                      fields.elements, file));
        store->owned_fields.resize((bytes.size() + 7) / 8);
        std::memcpy(store->owned_fields.data(), bytes.data(), bytes.size());
        store->fields = reinterpret_cast<const uint8_t*>(store->owned_fields.data());
      }
    }
    if (index_offset == kNoOffset && index_size > 0) {
      SF_RETURN_IF_ERROR(ReadVector(f.get(), "/shardfeed/index", H5T_NATIVE_UINT8, &index_bytes,
                                    index_size, file));
      store->owned_index.resize(store->header.sample_count);
      std::memcpy(store->owned_index.data(), index_bytes.data(), index_bytes.size());
      store->index = store->owned_index.data();
    }
    SF_RETURN_IF_ERROR(ReadVector(f.get(), "/shardfeed/chunk_sizes", H5T_NATIVE_UINT64,
                                  &chunk_sizes, store->header.chunk_count, file));
    uint64_t total = 0;
    for (uint64_t size : chunk_sizes) {
      if (size > store->file_bytes || (total += size) > store->file_bytes) {
        return Status::Corrupt(file, ": chunk sizes add up to more than the file holds");
      }
    }
    SF_ASSIGN_OR_RETURN(chunk_bytes, ReadU64Attr(f.get(), "chunk_bytes", file));
    if (chunk_bytes > (uint64_t{1} << 31) ||
        (chunk_bytes > 0 && chunk_bytes < 64 && total / chunk_bytes > store->file_bytes / 64)) {
      return Status::Corrupt(file, ": implausible chunk_bytes ", chunk_bytes);
    }
    const bool images_mode = chunk_bytes == 0;
    if (images_mode) {
      // Version 4: the var stream VarEntries address in this mode (absent: no variable fields;
      // an entry pointing into it then fails its bounds check).
      store->var_stream = true;
      const Placement var = Place(f.get(), "/shardfeed/var", store->file_bytes);
      if (var.exists && var.elements > store->file_bytes) {
        return Status::Corrupt(file, ": /shardfeed/var holds ", var.elements,
                               " bytes, more than the file");
      }
      store->var_size = var.elements;
      if (var.offset != kNoOffset) {
        var_offset = var.offset;
      } else if (var.elements > 0) {
        SF_RETURN_IF_ERROR(ReadVector(f.get(), "/shardfeed/var", H5T_NATIVE_UINT8,
                                      &store->owned_var, var.elements, file));
        store->var_data = store->owned_var.data();
      }
    }
    const char* name = images_mode ? "images" : "records";
    if (H5Lexists(f.get(), name, H5P_DEFAULT) <= 0)
      return Status::Corrupt(file, ": missing /", name);
    Handle dset(H5Dopen2(f.get(), name, H5P_DEFAULT));
    if (!dset.ok()) return Status::Corrupt(file, ": cannot open /", name);
    uint64_t next_piece = 0;
    for (uint64_t k = 0; k < chunk_sizes.size(); ++k) {
      const uint64_t pieces =
          images_mode ? 1 : std::max<uint64_t>(1, (chunk_sizes[k] + chunk_bytes - 1) / chunk_bytes);
      std::vector<uint64_t> addrs;
      for (uint64_t j = 0; j < pieces; ++j) {
        hsize_t coord[4] = {images_mode ? k : (next_piece + j) * chunk_bytes, 0, 0, 0};
        unsigned mask = 0;
        haddr_t addr = HADDR_UNDEF;
        hsize_t size = 0;
        if (H5Dget_chunk_info_by_coord(dset.get(), coord, &mask, &addr, &size) < 0 ||
            addr == HADDR_UNDEF) {
          return Status::Corrupt(file, ": chunk ", k, " has no storage");
        }
        if (images_mode && size != chunk_sizes[k]) {
          return Status::Corrupt(file, ": chunk ", k, " is ", size, " bytes, table says ",
                                 chunk_sizes[k]);
        }
        if (!images_mode && size != chunk_bytes)
          return Status::Corrupt(file, ": records chunk of unexpected size");
        if (addr > store->file_bytes || size > store->file_bytes - addr) {
          return Status::Corrupt(file, ": chunk ", k,
                                 " lies past the end of the file (truncated?)");
        }
        addrs.push_back(addr);
      }
      next_piece += pieces;
      piece_addr.push_back(std::move(addrs));
    }
  }

  // Phase 2, no HDF5: map the file and point into it.
  int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::IOError(file, ": ", std::strerror(errno));
  void* map = ::mmap(nullptr, store->file_bytes, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (map == MAP_FAILED) return Status::IOError(file, ": mmap: ", std::strerror(errno));
  store->map_ = map;
  store->map_len_ = store->file_bytes;
  store->map_base = static_cast<const uint8_t*>(map);
  store->map_size = store->file_bytes;
  const auto* base = static_cast<const uint8_t*>(map);
  if (index_offset != kNoOffset) {
    store->index = reinterpret_cast<const IndexEntry*>(base + index_offset);
  }
  if (fields_offset != kNoOffset) store->fields = base + fields_offset;
  if (var_offset != kNoOffset) store->var_data = base + var_offset;
  store->chunk_data.resize(chunk_sizes.size());
  store->chunk_size = chunk_sizes;
  for (size_t k = 0; k < chunk_sizes.size(); ++k) {
    const auto& addrs = piece_addr[k];
    bool adjacent = true;
    for (size_t j = 1; j < addrs.size(); ++j) adjacent &= addrs[j] == addrs[j - 1] + chunk_bytes;
    if (adjacent) {
      store->chunk_data[k] = base + addrs[0];
      continue;
    }
    // Pieces scattered in the file (not what our writer produces, but valid HDF5): assemble once.
    std::vector<uint8_t> joined(chunk_sizes[k]);
    for (size_t j = 0; j < addrs.size(); ++j) {
      size_t len = std::min<size_t>(chunk_bytes, chunk_sizes[k] - j * chunk_bytes);
      std::memcpy(joined.data() + j * chunk_bytes, base + addrs[j], len);
    }
    store->owned_chunks.push_back(std::move(joined));
    store->chunk_data[k] = store->owned_chunks.back().data();
  }
  return std::unique_ptr<ShardStore>(std::move(store));
}

}  // namespace shardfeed::format
