#include "tasks/bert/bert_shard.h"

#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <type_traits>
#include <utility>

#include <fcntl.h>
#include <hdf5.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "hetseq/core/error.h"
#include "hetseq/core/format.h"

namespace hetseq::bert {
namespace {

static_assert(std::is_same_v<hid_t, int64_t>, "ShardReader stores an hid_t as int64_t");

/// Owns an HDF5 identifier and closes it with `close` (H5Dclose, H5Sclose, ...).
class Handle {
 public:
  Handle(hid_t id, herr_t (*close)(hid_t)) : id_(id), close_(close) {}
  ~Handle() {
    if (id_ >= 0) close_(id_);
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }

 private:
  hid_t id_;
  herr_t (*close_)(hid_t);
};

/// HDF5 prints its error stack on stderr by default; hetseq reports errors itself. The setting is per thread.
void silence_hdf5() { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }

std::string class_name(H5T_class_t c) {
  switch (c) {
    case H5T_INTEGER: return "integer";
    case H5T_FLOAT: return "float";
    case H5T_STRING: return "string";
    case H5T_COMPOUND: return "compound";
    case H5T_ENUM: return "enum";
    case H5T_ARRAY: return "array";
    default: return "non-numeric";
  }
}

/// The sizes of dataset `name` in `file` after checking it exists, is a dataset and holds integers.
std::vector<int64_t> dataset_shape(hid_t file, const std::string& path, const std::string& name) {
  const std::string layout_hint = fmt::format("a BERT shard holds the datasets {}", fmt::join(shard_dataset_names(), ", "));
  const htri_t exists = H5Lexists(file, name.c_str(), H5P_DEFAULT);
  if (exists < 0) {
    // HDF5 could not read the group's index to look the name up: the file is damaged, not the layout.
    throw InputError(fmt::format("{}: cannot look up dataset '{}': the file's group index is damaged; rewrite the "
                                 "shard with scripts/bert_preprocess.py",
                                 path, name));
  }
  if (exists == 0) {
    throw InputError(fmt::format("{}: dataset '{}' is missing; {} (see scripts/bert_preprocess.py)", path, name,
                                 layout_hint));
  }
  Handle set(H5Dopen2(file, name.c_str(), H5P_DEFAULT), H5Dclose);
  if (!set.valid()) throw InputError(fmt::format("{}: '{}' is not a dataset; {}", path, name, layout_hint));
  Handle type(H5Dget_type(set.get()), H5Tclose);
  const H5T_class_t type_class = H5Tget_class(type.get());
  if (type_class != H5T_INTEGER) {
    throw InputError(fmt::format("{}: dataset '{}' holds {} values, but token ids, masks and labels must be "
                                 "integers; rewrite the shard with scripts/bert_preprocess.py",
                                 path, name, class_name(type_class)));
  }
  // HDF5 1.10.8 accepts any size for an integer type and converts through a buffer of that size per value: a
  // damaged file that claims 2.7 GB per value made a read of three rows take 3 GB (found by fuzzing).
  const size_t bytes = H5Tget_size(type.get());
  if (bytes == 0 || bytes > 8) {
    throw InputError(fmt::format("{}: dataset '{}' holds integers of {} bytes, but token ids, masks and labels are "
                                 "integers of 1 to 8 bytes; rewrite the shard with scripts/bert_preprocess.py",
                                 path, name, bytes));
  }
  Handle space(H5Dget_space(set.get()), H5Sclose);
  const int rank = H5Sget_simple_extent_ndims(space.get());
  if (rank < 0) throw InputError(fmt::format("{}: cannot read the shape of dataset '{}'", path, name));
  std::vector<hsize_t> dims(static_cast<size_t>(rank));
  H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
  // A dataset stored in one piece (in the header, or contiguous in the file) must hold what its shape needs:
  // HDF5 1.10.8 reads rows past a shorter piece (found by fuzzing: a compact dataset whose data was shorter than
  // its shape made H5Dread copy from beyond it). Chunks are checked as they are read (Note [Short chunks]).
  Handle create(H5Dget_create_plist(set.get()), H5Pclose);
  const H5D_layout_t layout = create.valid() ? H5Pget_layout(create.get()) : H5D_LAYOUT_ERROR;
  if (layout == H5D_COMPACT || layout == H5D_CONTIGUOUS) {
    hsize_t needed = bytes;
    bool overflow = false;
    for (hsize_t d : dims) overflow = overflow || __builtin_mul_overflow(needed, d, &needed);
    const hsize_t stored = H5Dget_storage_size(set.get());
    const bool unwritten = layout == H5D_CONTIGUOUS && stored == 0;  // HDF5 reads the fill value
    if (overflow || (stored != needed && !unwritten)) {
      throw InputError(fmt::format("{}: dataset '{}' is stored in {} bytes, but its shape [{}] needs {}; the file is "
                                   "corrupt",
                                   path, name, stored, fmt::join(dims, ", "),
                                   overflow ? std::string("more than 2^64") : std::to_string(needed)));
    }
  }
  return std::vector<int64_t>(dims.begin(), dims.end());
}

// Note [Short chunks]
// ~~~~~~~~~~~~~~~~~~~
// Debian's HDF5 1.10.8 does not check that a gzip-compressed chunk inflates to the chunk's size. A
// damaged chunk that inflates short makes H5Dread copy past the end of HDF5's own buffer into the rows
// (a heap over-read, found by fuzzing the shard reader under ASan: docs/RELIABILITY.md). So before the
// first read that touches a chunk, hetseq checks it: a chunk of a compressed dataset is read as stored
// (H5Dread_chunk) and inflated with zlib, counting the bytes, and anything but exactly a chunk's bytes
// is a corrupt file, reported with the row and the dataset; a chunk stored without the filter (the
// filter mask says so) must hold exactly a chunk's bytes. Each chunk is checked once per open shard,
// which costs one more inflate of every compressed chunk that training reads. A dataset without
// filters needs no check (HDF5 reads a whole chunk from the file, whatever was written), and pipelines
// with other filters than deflate (after shuffle, which keeps the size) are left to HDF5. Datasets
// stored in one piece are checked whole by inspect_shard.

/// Checks the chunks of one dataset as reads reach them (Note [Short chunks]).
class ChunkCheck {
 public:
  ChunkCheck(hid_t set, const std::string& path, const std::string& name) : path_(path), name_(name) {
    Handle create(H5Dget_create_plist(set), H5Pclose);
    if (!create.valid() || H5Pget_layout(create.get()) != H5D_CHUNKED) return;
    const int filters = H5Pget_nfilters(create.get());
    for (int i = 0; i < filters; ++i) {
      unsigned flags = 0;
      size_t values = 0;
      unsigned config = 0;
      const H5Z_filter_t id = H5Pget_filter2(create.get(), static_cast<unsigned>(i), &flags, &values, nullptr, 0,
                                             nullptr, &config);
      const bool last = i == filters - 1;
      if (last && id == H5Z_FILTER_DEFLATE) {
        deflate_index_ = i;
      } else if (last || id != H5Z_FILTER_SHUFFLE) {
        return;  // another pipeline: left to HDF5
      }
    }
    if (deflate_index_ < 0) return;
    Handle space(H5Dget_space(set), H5Sclose);
    const int rank = H5Sget_simple_extent_ndims(space.get());
    if (rank < 1 || rank > 2) return;
    chunk_.assign(static_cast<size_t>(rank), 1);
    if (H5Pget_chunk(create.get(), rank, chunk_.data()) != rank) return;
    Handle type(H5Dget_type(set), H5Tclose);
    chunk_bytes_ = H5Tget_size(type.get());
    for (hsize_t c : chunk_) chunk_bytes_ *= c;
    if (chunk_bytes_ == 0) return;
    Handle file(H5Iget_file_id(set), H5Fclose);
    if (H5Fget_filesize(file.get(), &file_size_) < 0) return;
    applies_ = true;
  }

  /// Checks every chunk that rows `rows` and columns [0, width) touch and that no earlier call checked.
  void before_read(hid_t set, const std::vector<int64_t>& rows, int64_t width) {
    if (!applies_) return;
    const hsize_t columns = chunk_.size() == 2 ? (static_cast<hsize_t>(width) + chunk_[1] - 1) / chunk_[1] : 1;
    for (int64_t row : rows) {
      const hsize_t chunk_row = static_cast<hsize_t>(row) / chunk_[0];
      for (hsize_t c = 0; c < columns; ++c) {
        if (!checked_.insert({chunk_row, c}).second) continue;
        hsize_t offset[2] = {chunk_row * chunk_[0], c * (chunk_.size() == 2 ? chunk_[1] : 1)};
        check(set, offset);
      }
    }
  }

 private:
  void check(hid_t set, const hsize_t* offset) const {
    // The stored size as H5Dread_chunk and H5Dread look the chunk up. H5Dget_chunk_info_by_coord walks the
    // index instead, and in a damaged index with two entries for one chunk it finds the other one (fuzzing
    // found such a file: H5Dread_chunk then wrote past a buffer of the size it had reported).
    unsigned mask = 0;
    hsize_t stored = 0;
    if (H5Dget_chunk_storage_size(set, offset, &stored) < 0 || stored == 0) {
      return;  // not written: HDF5 reads the fill value
    }
    const std::string where = fmt::format("{}: dataset '{}', the chunk of row {}", path_, name_, offset[0]);
    if (stored > file_size_) {
      throw InputError(fmt::format("{}: stored as {} bytes, more than the file holds; the file is corrupt", where,
                                   stored));
    }
    std::vector<uint8_t> raw(static_cast<size_t>(stored));
    if (stored == 0 || H5Dread_chunk(set, H5P_DEFAULT, offset, &mask, raw.data()) < 0) {
      throw InputError(fmt::format("{}: cannot be read; the file is truncated or corrupt", where));
    }
    if ((mask >> deflate_index_) & 1U) {  // stored without compression
      if (stored != chunk_bytes_) {
        throw InputError(fmt::format("{}: holds {} bytes, not the {} of a chunk; the file is corrupt", where, stored,
                                     chunk_bytes_));
      }
      return;
    }
    // Inflated through a small window, counting bytes: a damaged file's chunk size allocates nothing here.
    std::vector<uint8_t> window(64 * 1024);
    z_stream z{};
    if (inflateInit(&z) != Z_OK) throw std::bad_alloc();
    z.next_in = raw.data();
    z.avail_in = static_cast<uInt>(raw.size());
    int status = Z_OK;
    while (status == Z_OK && z.total_out <= chunk_bytes_) {
      z.next_out = window.data();
      z.avail_out = static_cast<uInt>(window.size());
      status = inflate(&z, Z_NO_FLUSH);
    }
    const uLong produced = z.total_out;
    const bool input_ended = z.avail_in == 0;
    const std::string zlib_message = z.msg != nullptr ? z.msg : zError(status);
    inflateEnd(&z);
    if (status == Z_STREAM_END && produced == chunk_bytes_) return;
    if (produced > chunk_bytes_) {
      throw InputError(fmt::format("{}: inflates to more than the {} bytes of a chunk; the file is corrupt", where,
                                   chunk_bytes_));
    }
    if (status == Z_STREAM_END) {
      throw InputError(fmt::format("{}: inflates to {} bytes, not the {} of a chunk; the file is corrupt", where,
                                   produced, chunk_bytes_));
    }
    if (status == Z_BUF_ERROR && input_ended) {  // the stream stops short (what HDF5 itself lets through)
      throw InputError(fmt::format("{}: its compressed data ends after {} of the chunk's {} bytes; the file is corrupt",
                                   where, produced, chunk_bytes_));
    }
    throw InputError(fmt::format("{}: does not inflate (zlib: {}); the file is corrupt", where,
                                 zlib_message));
  }

  std::string path_;
  std::string name_;
  bool applies_ = false;
  int deflate_index_ = -1;
  std::vector<hsize_t> chunk_;
  hsize_t chunk_bytes_ = 0;
  hsize_t file_size_ = 0;  // no chunk can be stored in more
  std::set<std::pair<hsize_t, hsize_t>> checked_;
};

/// Reads rows `rows` of the [N, width] (or [N]) dataset `name` as int64 [k, width].
torch::Tensor read_dataset_rows(hid_t file, const std::string& path, const std::string& name,
                                const std::vector<int64_t>& rows, int64_t width,
                                std::map<std::string, ChunkCheck>& chunks) {
  Handle set(H5Dopen2(file, name.c_str(), H5P_DEFAULT), H5Dclose);
  Handle file_space(H5Dget_space(set.get()), H5Sclose);
  const int rank = H5Sget_simple_extent_ndims(file_space.get());
  const auto k = static_cast<int64_t>(rows.size());
  torch::Tensor out = torch::empty({k, width}, torch::kInt64);
  if (k == 0) return out;
  auto check = chunks.find(name);
  if (check == chunks.end()) check = chunks.emplace(name, ChunkCheck(set.get(), path, name)).first;
  check->second.before_read(set.get(), rows, width);
  H5Sselect_none(file_space.get());
  // Consecutive rows become one hyperslab block: [begin, begin + count).
  size_t i = 0;
  while (i < rows.size()) {
    size_t j = i + 1;
    while (j < rows.size() && rows[j] == rows[j - 1] + 1) ++j;
    const hsize_t start[2] = {static_cast<hsize_t>(rows[i]), 0};
    const hsize_t count[2] = {static_cast<hsize_t>(j - i), static_cast<hsize_t>(width)};
    H5Sselect_hyperslab(file_space.get(), H5S_SELECT_OR, start, nullptr, count, nullptr);
    i = j;
  }
  const hsize_t mem_dims[2] = {static_cast<hsize_t>(k), static_cast<hsize_t>(width)};
  Handle mem_space(H5Screate_simple(rank, mem_dims, nullptr), H5Sclose);
  if (H5Dread(set.get(), H5T_NATIVE_INT64, mem_space.get(), file_space.get(), H5P_DEFAULT, out.data_ptr<int64_t>()) < 0) {
    throw InputError(fmt::format("{}: reading {} rows of dataset '{}' failed; the file may be truncated or corrupt",
                                 path, k, name));
  }
  return out;
}

// Note [Mapped shards]
// ~~~~~~~~~~~~~~~~~~~~
// A shard as scripts/bert_preprocess.py writes it stores each dataset contiguously and unfiltered: row r of a
// dataset of `width` integers of b bytes is the b * width bytes at the dataset's offset plus r * b * width.
// Reading a batch's rows through HDF5 costs a hyperslab selection and a type conversion per dataset under a
// process-wide lock (the library is serialised), which held one rank's collate to about 10 000 sequences/s on
// this project's 2-core machine. So when all six datasets of a shard are like that (contiguous, no filter,
// little-endian integers of 1, 2, 4 or 8 bytes, their bytes inside the file), the reader maps the file
// read-only and copies the rows itself, converting to int64, with no HDF5 call and no lock: the loader's
// threads collate at once. Offsets and sizes come from HDF5 when the shard is opened, and a dataset whose
// bytes would end past the end of the file is read through HDF5 instead (which reports the damage). Chunked
// or compressed shards (NVIDIA's, HetSeq's gzip ones) keep the HDF5 path and its chunk checks (Note [Short
// chunks]). A file truncated while it is mapped would be a bus error, as for any mapped file.

/// Where a contiguous dataset's rows lie in the file, for Note [Mapped shards]; nullopt when it is not one.
struct MappedDataset {
  uint64_t offset = 0;   // of row 0, in bytes from the start of the file
  int64_t width = 0;     // integers a row
  size_t bytes = 0;      // of one integer
  bool is_signed = true;
};

std::optional<MappedDataset> mapped_dataset(hid_t file, const std::string& name, int64_t rows, int64_t width,
                                            uint64_t file_size) {
  Handle set(H5Dopen2(file, name.c_str(), H5P_DEFAULT), H5Dclose);
  if (!set.valid()) return std::nullopt;
  Handle create(H5Dget_create_plist(set.get()), H5Pclose);
  if (!create.valid() || H5Pget_layout(create.get()) != H5D_CONTIGUOUS || H5Pget_nfilters(create.get()) != 0) {
    return std::nullopt;
  }
  Handle type(H5Dget_type(set.get()), H5Tclose);
  if (H5Tget_class(type.get()) != H5T_INTEGER || H5Tget_order(type.get()) != H5T_ORDER_LE) return std::nullopt;
  MappedDataset d;
  d.bytes = H5Tget_size(type.get());
  if (d.bytes != 1 && d.bytes != 2 && d.bytes != 4 && d.bytes != 8) return std::nullopt;
  d.is_signed = H5Tget_sign(type.get()) != H5T_SGN_NONE;
  const haddr_t offset = H5Dget_offset(set.get());
  if (offset == HADDR_UNDEF) return std::nullopt;
  d.offset = offset;
  d.width = width;
  const uint64_t size = static_cast<uint64_t>(rows) * static_cast<uint64_t>(width) * d.bytes;
  if (d.offset > file_size || size > file_size - d.offset) return std::nullopt;
  return d;
}

template <typename T>
void widen(const uint8_t* from, int64_t count, int64_t* to) {
  for (int64_t i = 0; i < count; ++i) {
    T v;
    std::memcpy(&v, from + i * static_cast<int64_t>(sizeof(T)), sizeof(T));
    to[i] = static_cast<int64_t>(v);
  }
}

/// Rows `rows` of a mapped dataset as int64 [k, width].
torch::Tensor read_mapped_rows(const uint8_t* base, const MappedDataset& d, const std::vector<int64_t>& rows) {
  const auto k = static_cast<int64_t>(rows.size());
  torch::Tensor out = torch::empty({k, d.width}, torch::kInt64);
  int64_t* to = out.data_ptr<int64_t>();
  const uint64_t row_bytes = static_cast<uint64_t>(d.width) * d.bytes;
  for (int64_t i = 0; i < k; ++i) {
    const uint8_t* from = base + d.offset + static_cast<uint64_t>(rows[static_cast<size_t>(i)]) * row_bytes;
    int64_t* row = to + i * d.width;
    switch (static_cast<int>(d.bytes) * (d.is_signed ? 1 : -1)) {
      case 1: widen<int8_t>(from, d.width, row); break;
      case -1: widen<uint8_t>(from, d.width, row); break;
      case 2: widen<int16_t>(from, d.width, row); break;
      case -2: widen<uint16_t>(from, d.width, row); break;
      case 4: widen<int32_t>(from, d.width, row); break;
      case -4: widen<uint32_t>(from, d.width, row); break;
      default: widen<int64_t>(from, d.width, row); break;  // 8 bytes: an unsigned value above 2^63 wraps, and the
                                                           // range check rejects it as negative
    }
  }
  return out;
}

}  // namespace

const std::vector<std::string>& shard_dataset_names() {
  static const std::vector<std::string> names{"input_ids",     "input_mask",          "segment_ids",
                                              "masked_lm_positions", "masked_lm_ids", "next_sentence_labels"};
  return names;
}

ShardLayout inspect_shard(const std::string& path) {
  silence_hdf5();
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    throw InputError(fmt::format("{}: no such file (a BERT shard)", path));
  }
  if (H5Fis_hdf5(path.c_str()) <= 0) {
    throw InputError(fmt::format("{}: not an HDF5 file; BERT shards are HDF5 files made by scripts/bert_preprocess.py",
                                 path));
  }
  Handle file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (!file.valid()) throw InputError(fmt::format("{}: cannot open the HDF5 file", path));

  std::map<std::string, std::vector<int64_t>> shapes;  // [dataset name]
  for (const std::string& name : shard_dataset_names()) shapes[name] = dataset_shape(file.get(), path, name);

  auto describe = [](const std::vector<int64_t>& s) { return fmt::format("[{}]", fmt::join(s, ", ")); };
  ShardLayout layout;
  layout.path = path;
  const auto& ids = shapes["input_ids"];
  if (ids.size() != 2) {
    throw InputError(fmt::format("{}: dataset 'input_ids' has shape {}, but must be [sequences, seq_length]", path,
                                 describe(ids)));
  }
  layout.num_samples = ids[0];
  layout.seq_length = ids[1];
  const auto& positions = shapes["masked_lm_positions"];
  if (positions.size() != 2) {
    throw InputError(fmt::format("{}: dataset 'masked_lm_positions' has shape {}, but must be [sequences, "
                                 "max_predictions_per_seq]",
                                 path, describe(positions)));
  }
  layout.max_predictions = positions[1];
  const std::map<std::string, std::vector<int64_t>> expected{
      {"input_mask", {layout.num_samples, layout.seq_length}},
      {"segment_ids", {layout.num_samples, layout.seq_length}},
      {"masked_lm_positions", {layout.num_samples, layout.max_predictions}},
      {"masked_lm_ids", {layout.num_samples, layout.max_predictions}},
  };
  for (const auto& [name, shape] : expected) {
    if (shapes[name] != shape) {
      throw InputError(fmt::format("{}: dataset '{}' has shape {}, expected {} to match 'input_ids' {} and "
                                   "'masked_lm_positions' {}",
                                   path, name, describe(shapes[name]), describe(shape), describe(ids),
                                   describe(positions)));
    }
  }
  const auto& nsl = shapes["next_sentence_labels"];
  const bool nsl_ok = (nsl.size() == 1 && nsl[0] == layout.num_samples) ||
                      (nsl.size() == 2 && nsl[0] == layout.num_samples && nsl[1] == 1);
  if (!nsl_ok) {
    throw InputError(fmt::format("{}: dataset 'next_sentence_labels' has shape {}, expected [{}] (one label per "
                                 "sequence, as 'input_ids' {})",
                                 path, describe(nsl), layout.num_samples, describe(ids)));
  }
  if (layout.num_samples == 0) throw InputError(fmt::format("{}: the shard holds no sequences", path));
  if (layout.seq_length < 2 || layout.max_predictions < 1) {
    throw InputError(fmt::format("{}: 'input_ids' {} and 'masked_lm_positions' {} leave no room for a sequence pair",
                                 path, describe(ids), describe(positions)));
  }
  return layout;
}

struct ShardReader::Chunks {
  std::map<std::string, ChunkCheck> by_dataset;
  // Note [Mapped shards]: the file mapped read-only, and where each dataset's rows are; empty when not mapped.
  const uint8_t* base = nullptr;
  size_t length = 0;
  std::map<std::string, MappedDataset> mapped;  // [dataset name]
};

ShardReader::ShardReader(ShardLayout layout) : layout_(std::move(layout)), chunks_(std::make_unique<Chunks>()) {
  silence_hdf5();
  file_ = H5Fopen(layout_.path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  if (file_ < 0) throw InputError(fmt::format("{}: cannot open the HDF5 file", layout_.path));
  map_file();
}

void ShardReader::map_file() {
  if constexpr (__BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__) return;  // the rows are copied as little-endian bytes
  std::error_code ec;
  const uint64_t file_size = std::filesystem::file_size(layout_.path, ec);
  if (ec || file_size == 0) return;
  const int64_t n = layout_.num_samples, s = layout_.seq_length, m = layout_.max_predictions;
  const std::map<std::string, int64_t> widths{{"input_ids", s},           {"input_mask", s},    {"segment_ids", s},
                                              {"masked_lm_positions", m}, {"masked_lm_ids", m}, {"next_sentence_labels", 1}};
  std::map<std::string, MappedDataset> mapped;
  for (const auto& [name, width] : widths) {
    std::optional<MappedDataset> d = mapped_dataset(file_, name, n, width, file_size);
    if (!d) return;  // read through HDF5
    mapped[name] = *d;
  }
  const int fd = ::open(layout_.path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  void* base = ::mmap(nullptr, file_size, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (base == MAP_FAILED) return;
  chunks_->base = static_cast<const uint8_t*>(base);
  chunks_->length = file_size;
  chunks_->mapped = std::move(mapped);
}

ShardReader::~ShardReader() {
  if (chunks_->base != nullptr) ::munmap(const_cast<uint8_t*>(chunks_->base), chunks_->length);
  if (file_ >= 0) H5Fclose(file_);
}

bool ShardReader::mapped() const { return chunks_->base != nullptr; }

ShardRows ShardReader::read(const std::vector<int64_t>& rows) const {
  silence_hdf5();
  for (size_t i = 0; i < rows.size(); ++i) {
    HETSEQ_ASSERT(rows[i] >= 0 && rows[i] < layout_.num_samples && (i == 0 || rows[i] > rows[i - 1]),
                  "shard rows must be ascending, distinct and below {}; got {} at {}", layout_.num_samples, rows[i], i);
  }
  const std::string& p = layout_.path;
  const int64_t s = layout_.seq_length, m = layout_.max_predictions;
  ShardRows out;
  if (mapped()) {  // See Note [Mapped shards].
    const auto& d = chunks_->mapped;
    out.input_ids = read_mapped_rows(chunks_->base, d.at("input_ids"), rows);
    out.input_mask = read_mapped_rows(chunks_->base, d.at("input_mask"), rows);
    out.segment_ids = read_mapped_rows(chunks_->base, d.at("segment_ids"), rows);
    out.masked_lm_positions = read_mapped_rows(chunks_->base, d.at("masked_lm_positions"), rows);
    out.masked_lm_ids = read_mapped_rows(chunks_->base, d.at("masked_lm_ids"), rows);
    out.next_sentence_labels = read_mapped_rows(chunks_->base, d.at("next_sentence_labels"), rows).view({-1});
    return out;
  }
  out.input_ids = read_dataset_rows(file_, p, "input_ids", rows, s, chunks_->by_dataset);
  out.input_mask = read_dataset_rows(file_, p, "input_mask", rows, s, chunks_->by_dataset);
  out.segment_ids = read_dataset_rows(file_, p, "segment_ids", rows, s, chunks_->by_dataset);
  out.masked_lm_positions = read_dataset_rows(file_, p, "masked_lm_positions", rows, m, chunks_->by_dataset);
  out.masked_lm_ids = read_dataset_rows(file_, p, "masked_lm_ids", rows, m, chunks_->by_dataset);
  out.next_sentence_labels = read_dataset_rows(file_, p, "next_sentence_labels", rows, 1, chunks_->by_dataset).view({-1});
  return out;
}

}  // namespace hetseq::bert
