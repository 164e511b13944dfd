#include "bert/shard_writer.h"

#include <algorithm>
#include <fstream>
#include <stdexcept>

#include <hdf5.h>
#include <nlohmann/json.hpp>

namespace hetseq::test {

std::map<std::string, ShardArray> make_shard(int64_t n, int64_t s, int64_t p) {
  std::map<std::string, ShardArray> d;
  ShardArray ids{{n, s}, {}}, mask{{n, s}, {}}, segments{{n, s}, {}}, positions{{n, p}, {}}, masked{{n, p}, {}},
      nsl{{n}, {}};
  const int64_t used = s - 4;  // tokens in each row; the last four are padding
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t t = 0; t < s; ++t) {
      int64_t id = 0;
      if (t == 0) id = 101;
      else if (t == used - 1) id = 102;
      else if (t < used - 1) id = 1000 + i + t - 1;
      ids.values.push_back(id);
      mask.values.push_back(t < used ? 1 : 0);
      segments.values.push_back(t < used && t >= used / 2 ? 1 : 0);
    }
    for (int64_t j = 0; j < p; ++j) {
      positions.values.push_back(j < 2 ? j + 1 : 0);
      masked.values.push_back(j < 2 ? 2000 + i + j : 0);
    }
    nsl.values.push_back(i % 2);
  }
  d["input_ids"] = ids;
  d["input_mask"] = mask;
  d["segment_ids"] = segments;
  d["masked_lm_positions"] = positions;
  d["masked_lm_ids"] = masked;
  d["next_sentence_labels"] = nsl;
  return d;
}

void write_shard(const std::string& path, const std::map<std::string, ShardArray>& datasets) {
  const hid_t file = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  if (file < 0) throw std::runtime_error("cannot create " + path);
  for (const auto& [name, array] : datasets) {
    std::vector<hsize_t> dims(array.shape.begin(), array.shape.end());
    const hid_t space = H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr);
    const hid_t type = array.as_float ? H5T_IEEE_F64LE : H5T_STD_I32LE;
    const hid_t create = H5Pcreate(H5P_DATASET_CREATE);
    if (array.gzip) {
      std::vector<hsize_t> chunk(dims.begin(), dims.end());  // up to 4 rows per chunk
      if (!chunk.empty()) chunk[0] = std::min<hsize_t>(chunk[0], 4);
      for (hsize_t& c : chunk) c = std::max<hsize_t>(c, 1);
      H5Pset_chunk(create, static_cast<int>(chunk.size()), chunk.data());
      H5Pset_deflate(create, 6);
    }
    const hid_t set = H5Dcreate2(file, name.c_str(), type, space, H5P_DEFAULT, create, H5P_DEFAULT);
    H5Pclose(create);
    herr_t status;
    if (array.as_float) {
      std::vector<double> v(array.values.begin(), array.values.end());
      status = H5Dwrite(set, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data());
    } else {
      status = H5Dwrite(set, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, array.values.data());
    }
    H5Dclose(set);
    H5Sclose(space);
    if (status < 0) {
      H5Fclose(file);
      throw std::runtime_error("cannot write dataset " + name + " of " + path);
    }
  }
  H5Fclose(file);
}

void write_safetensors(const std::string& path, const std::map<std::string, torch::Tensor>& tensors) {
  nlohmann::json header;
  std::string data;
  for (const auto& [name, t] : tensors) {
    const torch::Tensor c = t.to(torch::kFloat32).contiguous();
    const size_t begin = data.size();
    data.append(reinterpret_cast<const char*>(c.data_ptr<float>()), c.numel() * sizeof(float));
    header[name] = {{"dtype", "F32"}, {"shape", c.sizes().vec()}, {"data_offsets", {begin, data.size()}}};
  }
  header["__metadata__"] = {{"format", "pt"}};
  const std::string text = header.dump();
  std::ofstream out(path, std::ios::binary);
  const uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>((n >> (8 * i)) & 0xff));
  out << text << data;
}

}  // namespace hetseq::test
