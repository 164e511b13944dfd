#include "tasks/bert/bert_shard.h"

#include <filesystem>
#include <type_traits>
#include <utility>

#include <hdf5.h>

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
  if (H5Lexists(file, name.c_str(), H5P_DEFAULT) <= 0) {
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
  Handle space(H5Dget_space(set.get()), H5Sclose);
  const int rank = H5Sget_simple_extent_ndims(space.get());
  if (rank < 0) throw InputError(fmt::format("{}: cannot read the shape of dataset '{}'", path, name));
  std::vector<hsize_t> dims(static_cast<size_t>(rank));
  H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
  return std::vector<int64_t>(dims.begin(), dims.end());
}

/// Reads rows `rows` of the [N, width] (or [N]) dataset `name` as int64 [k, width].
torch::Tensor read_dataset_rows(hid_t file, const std::string& path, const std::string& name,
                                const std::vector<int64_t>& rows, int64_t width) {
  Handle set(H5Dopen2(file, name.c_str(), H5P_DEFAULT), H5Dclose);
  Handle file_space(H5Dget_space(set.get()), H5Sclose);
  const int rank = H5Sget_simple_extent_ndims(file_space.get());
  const auto k = static_cast<int64_t>(rows.size());
  torch::Tensor out = torch::empty({k, width}, torch::kInt64);
  if (k == 0) return out;
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

ShardReader::ShardReader(ShardLayout layout) : layout_(std::move(layout)) {
  silence_hdf5();
  file_ = H5Fopen(layout_.path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  if (file_ < 0) throw InputError(fmt::format("{}: cannot open the HDF5 file", layout_.path));
}

ShardReader::~ShardReader() {
  if (file_ >= 0) H5Fclose(file_);
}

ShardRows ShardReader::read(const std::vector<int64_t>& rows) const {
  silence_hdf5();
  for (size_t i = 0; i < rows.size(); ++i) {
    HETSEQ_ASSERT(rows[i] >= 0 && rows[i] < layout_.num_samples && (i == 0 || rows[i] > rows[i - 1]),
                  "shard rows must be ascending, distinct and below {}; got {} at {}", layout_.num_samples, rows[i], i);
  }
  const std::string& p = layout_.path;
  const int64_t s = layout_.seq_length, m = layout_.max_predictions;
  ShardRows out;
  out.input_ids = read_dataset_rows(file_, p, "input_ids", rows, s);
  out.input_mask = read_dataset_rows(file_, p, "input_mask", rows, s);
  out.segment_ids = read_dataset_rows(file_, p, "segment_ids", rows, s);
  out.masked_lm_positions = read_dataset_rows(file_, p, "masked_lm_positions", rows, m);
  out.masked_lm_ids = read_dataset_rows(file_, p, "masked_lm_ids", rows, m);
  out.next_sentence_labels = read_dataset_rows(file_, p, "next_sentence_labels", rows, 1).view({-1});
  return out;
}

}  // namespace hetseq::bert
