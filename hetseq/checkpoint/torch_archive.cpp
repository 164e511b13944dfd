#include "hetseq/checkpoint/torch_archive.h"

#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/pickler.h>

#include "hetseq/core/error.h"
#include "hetseq/core/format.h"

namespace hetseq::detail {

// Note [Streamed save]
// ~~~~~~~~~~~~~~~~~~~~
// torch.save's archive is a zip file of uncompressed records: one per tensor storage (`data/0`,
// `data/1`, ... holding the storage's bytes), then the pickle program `data.pkl`, which refers to the
// storages by record name and carries each tensor's dtype, offset, shape and strides, then the zip
// directory. Nothing in the file needs to be written before it is known, so a save writes it straight
// into the temporary file, in that order, and holds at most one tensor's copy beyond the state itself:
//
// * The pickle program is made first, in memory (names, numbers and tensor metadata: kilobytes). The
//   pickler needs only tensors' metadata, so a tensor that is not a contiguous CPU tensor (on a GPU,
//   transposed, expanded) is pickled as a stand-in: a CPU tensor laid out as `t.to(kCPU).contiguous()`
//   will be (the layout comes from the same conversion on the meta device) whose storage has the right
//   size but no memory. A contiguous CPU tensor is pickled as itself.
// * LibTorch's PyTorchStreamWriter takes each record as a pointer and a length and hands the bytes to
//   a writer function without copying (it adds zip headers and computes the record's CRC-32); ours
//   appends to the temporary file. A contiguous CPU tensor's record is its own storage; a stand-in's is
//   its tensor converted then, written, and freed before the next record. The checkpoint's checksum
//   (Note [Checkpoint file]) reads the values in the same way.
// * The writer must never see a failed write: it would throw, and its destructor would try to finish
//   the archive and terminate the process. The file sink keeps the first error and ignores later
//   writes; the save skips the remaining records, lets the writer finish into nothing, and reports.
//
// The bytes are those of the in-memory encoding (archive_bytes, LibTorch's writeArchiveAndTensors of
// the tree with CPU copies), which a test compares for every kind of layout. A save to several files
// writes the first and copies it to the others (copy_file_atomically).

namespace {

// The pickle program of `root` as torch.save writes it, but with plain (untagged) dicts and lists:
// torch.load(weights_only=True) refuses the type tags that torch::pickle_save adds to typed containers.
// `records` receives, in record order, one tensor of each storage the program refers to.
std::vector<char> pickle_program(const c10::IValue& root, std::vector<torch::Tensor>& records) {
  std::vector<char> pickled;
  torch::jit::Pickler pickler([&](const char* buf, size_t n) { pickled.insert(pickled.end(), buf, buf + n); },
                              /*tensor_table=*/nullptr, /*type_renamer=*/nullptr, /*memoized_class_types=*/nullptr,
                              /*get_tensor_id=*/nullptr, /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(root);
  pickler.stop();
  records = pickler.tensorData();
  return pickled;
}

}  // namespace

torch::Tensor ArchiveTensors::stage(const torch::Tensor& t) {
  if (t.device().is_cpu() && t.is_contiguous()) return t;
  if (t.layout() != torch::kStrided || t.is_quantized()) return t.to(torch::kCPU).contiguous();
  const torch::Tensor like = t.to(torch::kMeta).contiguous();
  c10::Storage storage(c10::Storage::use_byte_size_t(), like.storage().nbytes(),
                       c10::DataPtr(nullptr, c10::Device(c10::kCPU)), /*allocator=*/nullptr, /*resizable=*/false);
  torch::Tensor stand_in = torch::empty({0}, t.options().device(torch::kCPU).requires_grad(false))
                               .set_(storage, like.storage_offset(), like.sizes(), like.strides());
  if (t.requires_grad()) stand_in.requires_grad_(true);
  stand_ins_.emplace(storage.unsafeGetStorageImpl(), StandIn{storage, t});
  return stand_in;
}

torch::Tensor ArchiveTensors::data(const torch::Tensor& staged) const {
  const auto it = stand_ins_.find(staged.storage().unsafeGetStorageImpl());
  if (it == stand_ins_.end()) return staged.to(torch::kCPU).contiguous();
  const torch::Tensor copy = it->second.source.to(torch::kCPU).contiguous();
  HETSEQ_ASSERT(copy.scalar_type() == staged.scalar_type() && copy.sizes() == staged.sizes() &&
                    copy.strides() == staged.strides() && copy.storage_offset() == staged.storage_offset() &&
                    copy.storage().nbytes() == staged.storage().nbytes(),
                "checkpoint: a tensor's CPU copy is not laid out as its stand-in (shape [{}], strides [{}])",
                fmt::join(copy.sizes(), ", "), fmt::join(copy.strides(), ", "));
  return copy;
}

void write_archive(const c10::IValue& root, const ArchiveTensors& tensors,
                   const std::function<bool(const void*, size_t)>& write) {
  std::vector<torch::Tensor> records;
  const std::vector<char> pickled = pickle_program(root, records);
  bool ok = true;
  // Declared after `ok`: its destructor finishes an unfinished archive through the lambda.
  caffe2::serialize::PyTorchStreamWriter writer([&](const void* data, size_t n) {
    ok = write(data, n) && ok;
    return n;  // never short: see Note [Streamed save]
  });
  for (size_t i = 0; i < records.size() && ok; ++i) {
    const torch::Tensor t = tensors.data(records[i]);
    writer.writeRecord(fmt::format("data/{}", i), t.storage().data(), t.storage().nbytes());
  }
  if (ok) writer.writeRecord("data.pkl", pickled.data(), pickled.size());
  writer.writeEndOfFile();
}

std::vector<char> archive_bytes(const c10::IValue& root) {
  std::vector<torch::Tensor> records;
  const std::vector<char> pickled = pickle_program(root, records);
  std::vector<char> archive;
  archive.reserve(pickled.size());
  caffe2::serialize::PyTorchStreamWriter writer([&](const void* data, size_t n) {
    const char* bytes = static_cast<const char*>(data);
    archive.insert(archive.end(), bytes, bytes + n);
    return n;
  });
  torch::jit::writeArchiveAndTensors("data", pickled.data(), pickled.size(), records, writer);
  writer.writeEndOfFile();
  return archive;
}

}  // namespace hetseq::detail
