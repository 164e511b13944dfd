// BERT's HDF5 shards: finding a split's shards, reading rows into batches with HetSeq's labels, and a clear error
// naming the file and the dataset for each kind of malformed shard.

#include <fstream>
#include <string>

#include <catch2/catch.hpp>
#include <hdf5.h>
#include <torch/torch.h>
#include <zlib.h>

#include "bert/shard_writer.h"
#include "hetseq/core/error.h"
#include "support/temp_dir.h"
#include "support/test_paths.h"
#include "tasks/bert/bert_dataset.h"
#include "tasks/bert/bert_shard.h"

using hetseq::InputError;
using hetseq::bert::BertDataOptions;
using hetseq::bert::BertDataset;
using hetseq::test::make_shard;
using hetseq::test::TempDir;
using hetseq::test::write_shard;

namespace {

BertDataOptions options_for(const std::vector<std::string>& files) {
  BertDataOptions o;
  o.files = files;
  o.vocab_size = 30522;
  o.type_vocab_size = 2;
  o.max_position_embeddings = 64;
  return o;
}

/// The message of the InputError that loading `file` as a split and reading all its rows throws.
std::string load_error(const std::string& file) {
  try {
    BertDataset data(options_for({file}));
    std::vector<int64_t> all(static_cast<size_t>(data.size()));
    for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int64_t>(i);
    data.collate(all);
  } catch (const InputError& e) {
    return e.what();
  }
  FAIL("expected an InputError for " << file);
  return {};
}

/// Replaces the stored bytes of the chunk of dataset `name` that starts at row `row` (HDF5's direct chunk write,
/// which bypasses the filters): `filter_mask` 0 says the bytes are deflated, 1 that they are not.
void overwrite_chunk(const std::string& file, const std::string& name, hsize_t row, const std::vector<uint8_t>& bytes,
                     uint32_t filter_mask = 0) {
  const hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  const hid_t set = H5Dopen2(f, name.c_str(), H5P_DEFAULT);
  const hsize_t offset[2] = {row, 0};
  const herr_t written = H5Dwrite_chunk(set, H5P_DEFAULT, filter_mask, offset, bytes.size(), bytes.data());
  H5Dclose(set);
  H5Fclose(f);
  REQUIRE(written >= 0);
}

/// `n` bytes of ones, deflated as HDF5's gzip filter stores them.
std::vector<uint8_t> deflated(size_t n) {
  const std::vector<uint8_t> plain(n, 1);
  uLongf length = compressBound(n);
  std::vector<uint8_t> out(length);
  REQUIRE(compress2(out.data(), &length, plain.data(), n, 6) == Z_OK);
  out.resize(length);
  return out;
}

}  // namespace

TEST_CASE("a split's shards are the sorted files whose names contain it and --num_file keeps the first N", "[bert][data]") {
  TempDir dir;
  for (const char* name : {"wiki_train_2.hdf5", "wiki_train_0.hdf5", "wiki_test_0.hdf5", "wiki_train_1.hdf5"}) {
    std::ofstream(dir / name) << "x";
  }
  using hetseq::bert::find_shards;
  CHECK(find_shards(dir.path(), "train", 0, "--train-subset") ==
        std::vector<std::string>{dir / "wiki_train_0.hdf5", dir / "wiki_train_1.hdf5", dir / "wiki_train_2.hdf5"});
  CHECK(find_shards(dir.path(), "train", 2, "--train-subset") ==
        std::vector<std::string>{dir / "wiki_train_0.hdf5", dir / "wiki_train_1.hdf5"});
  CHECK(find_shards(dir.path(), "test", 0, "--valid-subset") == std::vector<std::string>{dir / "wiki_test_0.hdf5"});
  CHECK(find_shards(dir / "wiki_test_0.hdf5", "train", 0, "--train-subset") ==
        std::vector<std::string>{dir / "wiki_test_0.hdf5"});
  CHECK_THROWS_WITH(find_shards(dir.path(), "valid", 0, "--valid-subset"),
                    Catch::Contains("--data") && Catch::Contains("'valid'") && Catch::Contains("--valid-subset"));
  CHECK_THROWS_WITH(find_shards(dir / "nowhere", "train", 0, "--train-subset"), Catch::Contains("nowhere"));
}

TEST_CASE("BERT batches hold the rows asked for in order across shards with HetSeq's MLM labels", "[bert][data]") {
  TempDir dir;
  write_shard(dir / "a_train.hdf5", make_shard(5, 16, 4));
  write_shard(dir / "b_train.hdf5", make_shard(3, 16, 4));
  BertDataOptions o = options_for({dir / "a_train.hdf5", dir / "b_train.hdf5"});
  o.open_files = 1;  // every switch of shard reopens a file
  BertDataset data(o);
  REQUIRE(data.size() == 8);
  CHECK(data.seq_length() == 16);

  const std::vector<int64_t> indices{6, 0, 4, 5, 1, 7};  // shard b row 1, a 0, a 4, b 0, a 1, b 2
  const hetseq::Batch batch = data.collate(indices);
  REQUIRE(batch.num_samples == 6);
  const std::vector<int64_t> rows{1, 0, 4, 0, 1, 2};
  const torch::Tensor ids = batch.at("input_ids");
  const torch::Tensor labels = batch.at("masked_lm_labels");
  REQUIRE(ids.sizes() == torch::IntArrayRef({6, 16}));
  for (int64_t k = 0; k < 6; ++k) {
    const int64_t r = rows[static_cast<size_t>(k)];
    INFO("batch position " << k);
    CHECK(ids[k][0].item<int64_t>() == 101);
    CHECK(ids[k][1].item<int64_t>() == 1000 + r);
    CHECK(labels[k][1].item<int64_t>() == 2000 + r);
    CHECK(labels[k][2].item<int64_t>() == 2001 + r);
    CHECK(labels[k].ne(-1).sum().item<int64_t>() == 2);
    CHECK(batch.at("next_sentence_labels")[k].item<int64_t>() == r % 2);
    CHECK(batch.at("input_mask")[k].sum().item<int64_t>() == 12);
    CHECK(batch.at("segment_ids")[k].sum().item<int64_t>() == 6);
  }
  CHECK(batch.at("input_ids").scalar_type() == torch::kInt64);
  // The masked positions, flat (b * 16 + s) and ascending, found on the host (Note [BERT loss and sample size]):
  // positions 1 and 2 of every row.
  std::vector<int64_t> flat;
  for (int64_t k = 0; k < 6; ++k) flat.insert(flat.end(), {16 * k + 1, 16 * k + 2});
  CHECK(torch::equal(batch.at("masked_lm_index"), torch::tensor(flat, torch::kInt64)));

  SECTION("--max_pred_length keeps only the first masked positions") {
    o.max_pred_length = 1;
    BertDataset limited(o);
    const hetseq::Batch b = limited.collate({0, 7});
    CHECK(b.at("masked_lm_labels")[0].ne(-1).sum().item<int64_t>() == 1);
    CHECK(b.at("masked_lm_labels")[1][1].item<int64_t>() == 2002);
    CHECK(torch::equal(b.at("masked_lm_index"), torch::tensor(std::vector<int64_t>{1, 17}, torch::kInt64)));
  }
  SECTION("an empty batch") {
    const hetseq::Batch empty = data.collate({});
    CHECK(empty.empty());
    CHECK(empty.at("input_ids").size(0) == 0);
    CHECK(empty.at("masked_lm_index").size(0) == 0);
  }
}

TEST_CASE("each kind of malformed BERT shard is an error naming the file and the dataset", "[bert][data]") {
  TempDir dir;
  const std::string file = dir / "shard_train.hdf5";
  auto shard = make_shard(4, 16, 4);

  SECTION("not an HDF5 file") {
    std::ofstream(file) << "plain text, not HDF5";
    CHECK_THAT(load_error(file), Catch::Contains(file) && Catch::Contains("not an HDF5 file"));
  }
  SECTION("a missing dataset") {
    for (const std::string& name : hetseq::bert::shard_dataset_names()) {
      auto broken = shard;
      broken.erase(name);
      write_shard(file, broken);
      INFO(name);
      CHECK_THAT(load_error(file), Catch::Contains(file) && Catch::Contains("'" + name + "' is missing"));
    }
  }
  SECTION("a dataset of the wrong shape") {
    shard["input_mask"] = hetseq::test::ShardArray{{4, 12}, std::vector<int64_t>(48, 1)};
    write_shard(file, shard);
    CHECK_THAT(load_error(file), Catch::Contains(file) && Catch::Contains("'input_mask' has shape [4, 12]"));
    shard = make_shard(4, 16, 4);
    shard["next_sentence_labels"] = hetseq::test::ShardArray{{3}, {0, 1, 0}};
    write_shard(file, shard);
    CHECK_THAT(load_error(file), Catch::Contains(file) && Catch::Contains("'next_sentence_labels' has shape [3]"));
    shard = make_shard(4, 16, 4);
    shard["input_ids"].shape = {64};
    write_shard(file, shard);
    CHECK_THAT(load_error(file), Catch::Contains(file) && Catch::Contains("'input_ids' has shape [64]"));
  }
  SECTION("a dataset of floats") {
    shard["segment_ids"].as_float = true;
    write_shard(file, shard);
    CHECK_THAT(load_error(file), Catch::Contains(file) && Catch::Contains("'segment_ids' holds float values"));
  }
  SECTION("integers wider than 8 bytes") {
    write_shard(file, shard);
    // segment_ids again, as 16-byte integers (HDF5 converts the int64 values).
    const hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    REQUIRE(H5Ldelete(f, "segment_ids", H5P_DEFAULT) >= 0);
    const hid_t wide = H5Tcopy(H5T_STD_I64LE);
    REQUIRE(H5Tset_size(wide, 16) >= 0);
    const hsize_t dims[2] = {4, 16};
    const hid_t space = H5Screate_simple(2, dims, nullptr);
    const hid_t set = H5Dcreate2(f, "segment_ids", wide, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    const herr_t written = H5Dwrite(set, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT,
                                    shard["segment_ids"].values.data());
    H5Dclose(set);
    H5Sclose(space);
    H5Tclose(wide);
    H5Fclose(f);
    REQUIRE(written >= 0);
    CHECK_THAT(load_error(file), Catch::Contains(file) && Catch::Contains("'segment_ids' holds integers of 16 bytes"));
  }
  SECTION("ids outside the vocabulary") {
    shard["input_ids"].values[16 * 2 + 3] = 30522;
    write_shard(file, shard);
    CHECK_THAT(load_error(file), Catch::Contains(file) && Catch::Contains("'input_ids' row 2 holds 30522") &&
                                     Catch::Contains("vocab_size 30522"));
    shard = make_shard(4, 16, 4);
    shard["masked_lm_ids"].values[1] = -5;
    write_shard(file, shard);
    CHECK_THAT(load_error(file), Catch::Contains(file) && Catch::Contains("'masked_lm_ids' row 0 holds -5"));
  }
  SECTION("other values out of range") {
    shard["segment_ids"].values[5] = 2;
    write_shard(file, shard);
    CHECK_THAT(load_error(file), Catch::Contains("'segment_ids' row 0 holds 2") && Catch::Contains("type_vocab_size"));
    shard = make_shard(4, 16, 4);
    shard["masked_lm_positions"].values[4 + 1] = 16;
    write_shard(file, shard);
    CHECK_THAT(load_error(file), Catch::Contains("'masked_lm_positions' row 1 holds 16"));
    shard = make_shard(4, 16, 4);
    shard["next_sentence_labels"].values[3] = 7;
    write_shard(file, shard);
    CHECK_THAT(load_error(file), Catch::Contains("'next_sentence_labels' row 3 holds 7"));
    shard = make_shard(4, 16, 4);
    for (int64_t t = 0; t < 16; ++t) shard["input_mask"].values[16 * 2 + t] = 0;
    write_shard(file, shard);
    CHECK_THAT(load_error(file), Catch::Contains(file) && Catch::Contains("'input_mask' row 2 starts with 0"));
  }
  SECTION("sequences longer than the model's positions") {
    write_shard(file, make_shard(2, 80, 4));
    CHECK_THAT(load_error(file), Catch::Contains(file) && Catch::Contains("max_position_embeddings is 64"));
  }
  SECTION("shards of one split with different sequence lengths") {
    write_shard(file, shard);
    write_shard(dir / "other_train.hdf5", make_shard(2, 32, 4));
    CHECK_THROWS_WITH(BertDataset(options_for({file, dir / "other_train.hdf5"})),
                      Catch::Contains("other_train.hdf5") && Catch::Contains("must share max_seq_length"));
  }
}

TEST_CASE("BERT batches can be built from several threads at once", "[bert][data]") {
  TempDir dir;
  write_shard(dir / "a_train.hdf5", make_shard(40, 16, 4));
  write_shard(dir / "b_train.hdf5", make_shard(40, 16, 4));
  BertDataOptions o = options_for({dir / "a_train.hdf5", dir / "b_train.hdf5"});
  o.open_files = 1;
  BertDataset data(o);
  std::vector<std::thread> threads;
  std::atomic<int> wrong{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 20; ++round) {
        const int64_t a = (t * 7 + round) % 40, b = 40 + (t * 3 + round * 5) % 40;
        const hetseq::Batch batch = data.collate({b, a});
        if (batch.at("input_ids")[0][1].item<int64_t>() != 1000 + (b - 40)) ++wrong;
        if (batch.at("input_ids")[1][1].item<int64_t>() != 1000 + a) ++wrong;
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(wrong.load() == 0);
}

TEST_CASE("a compressed chunk that does not inflate to a chunk's size is an error naming the file, the dataset and "
          "the row",
          "[bert][data]") {
  // Debian's HDF5 would copy past the end of a short chunk into the rows (Note [Short chunks]).
  TempDir dir;
  const std::string file = dir / "shard_train.hdf5";
  auto shard = make_shard(8, 16, 4);
  for (auto& [name, array] : shard) array.gzip = true;  // chunks of 4 rows: 4 x 16 int32 = 256 bytes for input_mask
  write_shard(file, shard);
  const std::string chunk = file + ": dataset 'input_mask', the chunk of row 4";
  {
    // Intact chunks read as the same rows as a contiguous shard.
    auto plain = make_shard(8, 16, 4);
    write_shard(dir / "plain_train.hdf5", plain);
    BertDataset compressed(options_for({file}));
    BertDataset contiguous(options_for({dir / "plain_train.hdf5"}));
    const std::vector<int64_t> rows{0, 3, 4, 7};
    const hetseq::Batch a = compressed.collate(rows), b = contiguous.collate(rows);
    for (const char* field : {"input_ids", "input_mask", "segment_ids", "masked_lm_labels", "next_sentence_labels"}) {
      INFO(field);
      CHECK(torch::equal(a.at(field), b.at(field)));
    }
  }
  SECTION("inflates short") {
    overwrite_chunk(file, "input_mask", 4, deflated(168));
    CHECK(load_error(file) == chunk + ": inflates to 168 bytes, not the 256 of a chunk; the file is corrupt");
  }
  SECTION("inflates long") {
    overwrite_chunk(file, "input_mask", 4, deflated(300));
    CHECK(load_error(file) == chunk + ": inflates to more than the 256 bytes of a chunk; the file is corrupt");
  }
  SECTION("ends early") {
    auto cut = deflated(256);
    cut.resize(cut.size() / 2);
    overwrite_chunk(file, "input_mask", 4, cut);
    CHECK_THAT(load_error(file), Catch::StartsWith(chunk + ": its compressed data ends after ") &&
                                     Catch::EndsWith(" of the chunk's 256 bytes; the file is corrupt"));
  }
  SECTION("is not a zlib stream") {
    overwrite_chunk(file, "input_mask", 4, std::vector<uint8_t>(40, 0xab));
    CHECK_THAT(load_error(file), Catch::StartsWith(chunk + ": does not inflate (zlib: "));
  }
  SECTION("is stored uncompressed and short") {
    overwrite_chunk(file, "input_mask", 4, std::vector<uint8_t>(100, 1), 1);
    CHECK(load_error(file) == chunk + ": holds 100 bytes, not the 256 of a chunk; the file is corrupt");
  }
}

TEST_CASE("a dataset stored in one piece that is shorter than its shape is an error naming the file and the "
          "dataset",
          "[bert][data]") {
  // A fuzzer's finding (docs/RELIABILITY.md): 'input_ids' is compact (its data in the header), with less data than
  // its shape; HDF5 1.10.8 read rows past it.
  const std::string file = hetseq::test::source_dir() + "/fuzz/corpus/bert_shard/crash-hdf5-compact-short.h5";
  CHECK_THROWS_WITH(hetseq::bert::inspect_shard(file),
                    Catch::StartsWith(file + ": dataset 'input_ids' is stored in ") &&
                        Catch::EndsWith("; the file is corrupt"));
}

TEST_CASE("a shard whose damaged header claims an impossible allocation is an error naming the file and the "
          "dataset",
          "[bert][data]") {
  // A fuzzer's finding (docs/RELIABILITY.md): HDF5 asks malloc for 0xf8126edd000000b0 bytes while looking
  // 'input_ids' up in the root group's index; malloc returns NULL, the look-up fails (not "no such name"),
  // and hetseq must report the file, the dataset and the damage rather than crash, read on, or call the
  // dataset missing.
  const std::string file = std::string(HETSEQ_SOURCE_DIR) + "/fuzz/corpus/bert_shard/crash-hdf5-huge-allocation.h5";
  CHECK_THROWS_WITH(hetseq::bert::inspect_shard(file),
                    Catch::StartsWith(file + ": cannot look up dataset 'input_ids': the file's group index is damaged"));
}

// Note [Mapped shards]: a shard whose datasets are contiguous and unfiltered is read from the mapped file, without
// HDF5; a compressed one through HDF5. Both give the same rows.
TEST_CASE("a contiguous shard is read from its mapped file and gives the rows that HDF5 reads", "[bert][data]") {
  TempDir dir;
  auto shard = make_shard(12, 16, 4);
  write_shard(dir / "plain_train.hdf5", shard);
  for (auto& [name, array] : shard) array.gzip = true;
  write_shard(dir / "packed_train.hdf5", shard);
  const hetseq::bert::ShardReader plain(hetseq::bert::inspect_shard(dir / "plain_train.hdf5"));
  const hetseq::bert::ShardReader packed(hetseq::bert::inspect_shard(dir / "packed_train.hdf5"));
  CHECK(plain.mapped());
  CHECK(!packed.mapped());
  const std::vector<int64_t> rows{0, 3, 4, 11};
  const hetseq::bert::ShardRows a = plain.read(rows), b = packed.read(rows);
  CHECK(torch::equal(a.input_ids, b.input_ids));
  CHECK(torch::equal(a.input_mask, b.input_mask));
  CHECK(torch::equal(a.segment_ids, b.segment_ids));
  CHECK(torch::equal(a.masked_lm_positions, b.masked_lm_positions));
  CHECK(torch::equal(a.masked_lm_ids, b.masked_lm_ids));
  CHECK(torch::equal(a.next_sentence_labels, b.next_sentence_labels));
  CHECK(a.input_ids[1][1].item<int64_t>() == 1003);  // row 3's second token (make_shard)
  CHECK(a.next_sentence_labels.sizes() == torch::IntArrayRef({4}));
}
