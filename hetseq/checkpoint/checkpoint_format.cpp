#include "hetseq/checkpoint/checkpoint_format.h"

#include <zlib.h>

#include <algorithm>
#include <cstring>
#include <unordered_map>

#include <torch/serialize.h>
#include <torch/torch.h>
#include <torch/version.h>

#include "hetseq/checkpoint/pickle_scan.h"
#include "hetseq/checkpoint/torch_archive.h"
#include "hetseq/core/error.h"
#include "hetseq/core/format.h"

namespace hetseq {

// Note [Checkpoint file]
// ~~~~~~~~~~~~~~~~~~~~~~
// A checkpoint is one archive in torch.save's format (torch::pickle_save), so that Python reads it
// with `torch.load(path, weights_only=True)` and the same torch version. It holds a dict:
//
//   format_version, torch_version                      what wrote it (version 2 with shards)
//   model               {name: tensor}                 parameters and buffers
//   optimizer           {name, options {k: float}, state {k: tensor},   (no state with
//                        loss_scaler {k: float},        --no-save-optimizer-state; no loss_scaler
//                        shards {save_id, world_size}}  without --fp16; shards only with
//                                                       --zero-sharding os, whose buffers are in shard
//                                                       files: Note [Sharded optimizer state in
//                                                       checkpoints])
//   lr_scheduler        {name, state {k: float}}
//   extra_state         {num_updates, epoch, offset, meters {k: float}, rng_state, best,
//                        data_plan {batch_sizes [int], update_freqs [int], shares [int]},
//                        bucket_layout [[int]], cuda_rng_state [tensor],
//                        powersgd {update, world_size, buckets [{index, shapes [[int]],
//                                  matrices [int], q [tensor], errors [tensor]}]}}
//                                                       shares: the split in force (Note [Balancing]);
//                                                       bucket_layout: the gradient buckets' parameters
//                                                       (Note [Bucketed reduction]); cuda_rng_state:
//                                                       [device] (Note [Generator states in
//                                                       checkpoints]); powersgd: only with
//                                                       --ddp-comm-hook powersgd (Note [PowerSGD in
//                                                       checkpoints]); files written before any of
//                                                       them lack it, and load as before
//   args                {task, model_digest, options}  what must match on resume
//   checksum            int
//
// `checksum` is a CRC-32 over every other entry, visited in sorted key order: names, integers,
// floats (their 8 bytes), strings, and each tensor's dtype, shape and raw bytes. The archive format
// has its own per-record CRC, but it does not cover everything and is not always checked; ours makes
// a truncated or altered file an error on load rather than a silently different model. A truncated
// archive fails earlier, in the archive reader, and is reported the same way.
//
// The position is where the next update starts: `epoch` and `offset`, the number of samples of that
// epoch's permutation that completed updates consumed over all ranks (see Note [Data plan]). It does
// not depend on the ranks' batch sizes, so a run resumed on another cluster continues with the next
// sample of the same permutation.
//
// A save streams the archive into the file tensor by tensor (Note [Streamed save]): beyond the state,
// it takes at most one tensor's copy of host memory.

namespace {

using Dict = c10::impl::GenericDict;

Dict new_dict() { return Dict(c10::StringType::get(), c10::AnyType::get()); }

// How a tensor enters the value tree: as a CPU copy made at once (encode_checkpoint), as it is
// (state_digest: the checksum reads one tensor at a time), or as detail::ArchiveTensors::stage gives
// it (save_checkpoint).
using TensorForm = std::function<torch::Tensor(const torch::Tensor&)>;

torch::Tensor cpu_contiguous(const torch::Tensor& t) { return t.to(torch::kCPU).contiguous(); }

template <class V>
c10::IValue double_map(const std::map<std::string, V>& m) {
  c10::Dict<std::string, double> d;
  for (const auto& [k, v] : m) d.insert(k, static_cast<double>(v));
  return d;
}

c10::IValue tensor_map(const std::map<std::string, torch::Tensor>& m, const TensorForm& form) {
  c10::Dict<std::string, torch::Tensor> d;
  for (const auto& [k, v] : m) d.insert(k, form(v.detach()));
  return d;
}

// A list of ints as a generic list: an int list would be pickled with a type-specific builder that
// torch.load(weights_only=True) refuses.
c10::IValue int_list(const std::vector<int64_t>& v) {
  c10::impl::GenericList l(c10::AnyType::get());
  for (int64_t x : v) l.push_back(x);
  return l;
}

// The CRC-32 of an IValue tree; see Note [Checkpoint file].
class Crc {
 public:
  /// `tensors`: where the tree's tensors came from, when stand-ins are among them (Note [Streamed save]).
  explicit Crc(const detail::ArchiveTensors* tensors = nullptr) : tensors_(tensors) {}
  void bytes(const void* data, size_t n) {
    const auto* p = static_cast<const Bytef*>(data);
    while (n > 0) {
      const uInt chunk = static_cast<uInt>(std::min<size_t>(n, 1u << 30));
      crc_ = crc32(crc_, p, chunk);
      p += chunk;
      n -= chunk;
    }
  }
  void integer(int64_t v) { bytes(&v, sizeof v); }
  void text(const std::string& s) {
    integer(static_cast<int64_t>(s.size()));
    bytes(s.data(), s.size());
  }
  void value(const c10::IValue& v) {
    if (v.isTensor()) {
      const torch::Tensor t = tensors_ != nullptr ? tensors_->data(v.toTensor()) : cpu_contiguous(v.toTensor());
      integer(static_cast<int64_t>(t.scalar_type()));
      integer(t.dim());
      for (int64_t s : t.sizes()) integer(s);
      bytes(t.data_ptr(), t.nbytes());
    } else if (v.isDouble()) {
      integer(1);
      const double d = v.toDouble();
      bytes(&d, sizeof d);
    } else if (v.isInt()) {
      integer(2);
      integer(v.toInt());
    } else if (v.isBool()) {
      integer(3);
      integer(v.toBool() ? 1 : 0);
    } else if (v.isString()) {
      integer(4);
      text(v.toStringRef());
    } else if (v.isNone()) {
      integer(5);
    } else if (v.isGenericDict()) {
      integer(6);
      const auto d = v.toGenericDict();
      std::vector<std::string> keys;
      for (const auto& e : d) keys.push_back(e.key().toStringRef());
      std::sort(keys.begin(), keys.end());
      integer(static_cast<int64_t>(keys.size()));
      for (const auto& k : keys) {
        text(k);
        value(d.at(k));
      }
    } else if (v.isList()) {
      integer(7);
      const auto l = v.toList();
      integer(static_cast<int64_t>(l.size()));
      for (const c10::IValue& e : l) value(e);
    } else {
      throw InternalError(fmt::format("checkpoint checksum: unexpected value of type {}", v.tagKind()));
    }
  }
  int64_t result() const { return static_cast<int64_t>(crc_); }

 private:
  const detail::ArchiveTensors* tensors_;
  uLong crc_ = crc32(0L, Z_NULL, 0);
};

int64_t checksum_of(const Dict& d, const std::string& skip, const detail::ArchiveTensors* tensors = nullptr) {
  Dict copy = new_dict();
  for (const auto& e : d) {
    if (e.key().toStringRef() != skip) copy.insert(e.key(), e.value());
  }
  Crc crc(tensors);
  crc.value(copy);
  return crc.result();
}

// An exception's message without LibTorch's backtrace (c10::Error) or any other line after the first.
std::string first_line(const std::exception& e) {
  const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
  std::string what = c10_error != nullptr ? c10_error->what_without_backtrace() : e.what();
  if (auto nl = what.find('\n'); nl != std::string::npos) what.resize(nl);
  return what;
}

// Note [Unpickled values]
// ~~~~~~~~~~~~~~~~~~~~~~~
// LibTorch's unpickler builds whatever a pickle describes: dicts keyed by integers, tuples, objects. The checksum
// (Crc) and the readers below take a dict's keys as strings and know only the value types that encode_checkpoint
// writes, so before either sees the tree, Reader::plain_values walks it and rejects anything else as damage. A
// checkpoint whose dict had an integer key made the checksum throw LibTorch's internal assertion instead (found by
// fuzz/checkpoint_fuzz.cpp, docs/RELIABILITY.md).

// Typed access to a decoded archive; every miss is an error naming the file and the entry.
class Reader {
 public:
  explicit Reader(std::string source) : source_(std::move(source)) {}

  [[noreturn]] void fail(const std::string& what) const {
    throw InputError(fmt::format("{}: {}; it is not a hetseq checkpoint, or it is damaged: use another one", source_, what));
  }
  c10::IValue at(const Dict& d, const std::string& key) const {
    auto it = d.find(key);
    if (it == d.end()) fail(fmt::format("the entry '{}' is missing", key));
    return it->value();
  }
  Dict dict(const Dict& d, const std::string& key) const {
    const c10::IValue v = at(d, key);
    if (!v.isGenericDict()) fail(fmt::format("the entry '{}' is not a dict", key));
    return v.toGenericDict();
  }
  int64_t integer(const Dict& d, const std::string& key) const {
    const c10::IValue v = at(d, key);
    if (!v.isInt()) fail(fmt::format("the entry '{}' is not an integer", key));
    return v.toInt();
  }
  std::string text(const Dict& d, const std::string& key) const {
    const c10::IValue v = at(d, key);
    if (!v.isString()) fail(fmt::format("the entry '{}' is not a string", key));
    return v.toStringRef();
  }
  // See Note [Unpickled values].
  void plain_values(const c10::IValue& v, const std::string& where,
                    const std::unordered_map<const void*, size_t>& record_sizes) const {
    if (v.isGenericDict()) {
      for (const auto& e : v.toGenericDict()) {
        if (!e.key().isString()) {
          fail(fmt::format("{} has a key of type {}, not a string",
                           where.empty() ? std::string("the archive's dict") : fmt::format("the entry '{}'", where),
                           e.key().tagKind()));
        }
        plain_values(e.value(), where.empty() ? e.key().toStringRef() : where + "." + e.key().toStringRef(),
                     record_sizes);
      }
    } else if (v.isList()) {
      for (const c10::IValue& e : v.toList()) plain_values(e, where, record_sizes);
    } else if (v.isTensor()) {
      within_record(v.toTensor(), where, record_sizes);
    } else if (!(v.isDouble() || v.isInt() || v.isBool() || v.isString() || v.isNone())) {
      fail(fmt::format("the entry '{}' holds a value of type {}, which a checkpoint does not have", where, v.tagKind()));
    }
  }
  // The unpickler sizes a tensor's storage by the element count in the pickle and sets the tensor's sizes, strides
  // and offset over it, checking neither against the bytes of the record behind it: a damaged pickle made a 904-byte
  // view of an 8-byte record, which the next encode (and any use of the tensor) read past (found by
  // fuzz/checkpoint_fuzz.cpp under ASan). `record_sizes` comes from detail::load_archive.
  void within_record(const at::Tensor& t, const std::string& where,
                     const std::unordered_map<const void*, size_t>& record_sizes) const {
    if (!t.defined() || t.numel() == 0) return;
    if (!t.has_storage()) fail(fmt::format("the tensor '{}' has no data", where));
    const auto record = record_sizes.find(t.storage().data());
    const int64_t held = record == record_sizes.end() ? 0 : static_cast<int64_t>(record->second);
    int64_t last = t.storage_offset();  // the furthest element the view reaches, in elements
    bool bad = last < 0;
    for (int64_t d = 0; d < t.dim() && !bad; ++d) {
      int64_t step = 0;
      bad = t.stride(d) < 0 || __builtin_mul_overflow(t.size(d) - 1, t.stride(d), &step) ||
            __builtin_add_overflow(last, step, &last);
    }
    int64_t needed = 0;
    bad = bad || __builtin_add_overflow(last, 1, &needed) ||
          __builtin_mul_overflow(needed, static_cast<int64_t>(t.element_size()), &needed);
    if (bad || needed > held || static_cast<int64_t>(t.storage().nbytes()) > held) {
      fail(fmt::format("the tensor '{}' of shape [{}] reaches past the {} bytes of its record", where,
                       fmt::join(t.sizes(), ", "), held));
    }
  }
  std::vector<int64_t> ints(const Dict& d, const std::string& key) const {
    const c10::IValue v = at(d, key);
    if (!v.isList()) fail(fmt::format("the entry '{}' is not a list", key));
    std::vector<int64_t> out;
    for (const c10::IValue& e : v.toList()) {
      if (!e.isInt()) fail(fmt::format("the entry '{}' is not a list of integers", key));
      out.push_back(e.toInt());
    }
    return out;
  }
  std::vector<std::vector<int64_t>> int_lists(const Dict& d, const std::string& key) const {
    const c10::IValue v = at(d, key);
    if (!v.isList()) fail(fmt::format("the entry '{}' is not a list", key));
    std::vector<std::vector<int64_t>> out;
    for (const c10::IValue& inner : v.toList()) {
      if (!inner.isList()) fail(fmt::format("the entry '{}' is not a list of lists", key));
      out.emplace_back();
      for (const c10::IValue& e : inner.toList()) {
        if (!e.isInt()) fail(fmt::format("the entry '{}' is not a list of integer lists", key));
        out.back().push_back(e.toInt());
      }
    }
    return out;
  }
  std::map<std::string, double> doubles(const Dict& d, const std::string& key) const {
    std::map<std::string, double> out;
    for (const auto& e : dict(d, key)) {
      if (!e.value().isDouble()) fail(fmt::format("the entry '{}.{}' is not a number", key, e.key().toStringRef()));
      out[e.key().toStringRef()] = e.value().toDouble();
    }
    return out;
  }
  std::vector<torch::Tensor> tensor_list(const Dict& d, const std::string& key) const {
    const c10::IValue v = at(d, key);
    if (!v.isList()) fail(fmt::format("the entry '{}' is not a list", key));
    std::vector<torch::Tensor> out;
    for (const c10::IValue& e : v.toList()) {
      if (!e.isTensor()) fail(fmt::format("the entry '{}' is not a list of tensors", key));
      out.push_back(e.toTensor());
    }
    return out;
  }
  std::map<std::string, torch::Tensor> tensors(const Dict& d, const std::string& key) const {
    std::map<std::string, torch::Tensor> out;
    for (const auto& e : dict(d, key)) {
      if (!e.value().isTensor()) fail(fmt::format("the entry '{}.{}' is not a tensor", key, e.key().toStringRef()));
      out[e.key().toStringRef()] = e.value().toTensor();
    }
    return out;
  }

 private:
  std::string source_;
};

}  // namespace

namespace {

// The entries that make the training state: model, optimizer, lr_scheduler.
void insert_state(Dict& root, const Checkpoint& c, const TensorForm& form) {
  c10::Dict<std::string, torch::Tensor> model;
  for (const auto& [name, t] : c.model) model.insert(name, form(t.detach()));
  root.insert("model", model);

  Dict optimizer = new_dict();
  optimizer.insert("name", c.optimizer_name);
  optimizer.insert("options", double_map(c.optimizer_options));
  if (c.optimizer_state) optimizer.insert("state", tensor_map(*c.optimizer_state, form));
  if (!c.loss_scaler.empty()) optimizer.insert("loss_scaler", double_map(c.loss_scaler));
  if (c.optimizer_shards) {
    Dict shards = new_dict();
    shards.insert("save_id", c.optimizer_shards->save_id);
    shards.insert("world_size", c.optimizer_shards->world_size);
    optimizer.insert("shards", shards);
  }
  root.insert("optimizer", optimizer);

  Dict scheduler = new_dict();
  scheduler.insert("name", c.lr_scheduler_name);
  scheduler.insert("state", double_map(c.lr_scheduler_state));
  root.insert("lr_scheduler", scheduler);
}

c10::IValue tensor_list(const std::vector<torch::Tensor>& v, const TensorForm& form) {
  c10::impl::GenericList l(c10::AnyType::get());
  for (const auto& t : v) l.push_back(form(t.detach()));
  return l;
}

// The `powersgd` entry of extra_state; see Note [PowerSGD in checkpoints] (hetseq/reduce/powersgd_state.cpp).
c10::IValue powersgd_entry(const PowerSgdState& p, const TensorForm& form) {
  Dict out = new_dict();
  out.insert("update", p.update);
  out.insert("world_size", p.world_size);
  c10::impl::GenericList buckets(c10::AnyType::get());
  for (const auto& b : p.buckets) {
    Dict bucket = new_dict();
    bucket.insert("index", b.index);
    c10::impl::GenericList shapes(c10::AnyType::get());
    for (const auto& shape : b.shapes) shapes.push_back(int_list(shape));
    bucket.insert("shapes", shapes);
    bucket.insert("matrices", int_list(b.matrices));
    bucket.insert("q", tensor_list(b.q, form));
    bucket.insert("errors", tensor_list(b.errors, form));
    buckets.push_back(bucket);
  }
  out.insert("buckets", buckets);
  return out;
}

// Builds the checkpoint's value tree (Note [Checkpoint file]) with its tensors as `form` gives them,
// adds the checksum (reading stand-ins through `tensors`, if given) and hands the tree to `write`.
// The pickler memoizes a container that is referenced more than once when it is pickled, so the
// containers stay alive here until `write` returns, as when the archive was built in memory in this
// function: the bytes stay those that earlier versions wrote.
void with_checkpoint_tree(const Checkpoint& c, const TensorForm& form, const detail::ArchiveTensors* tensors,
                          const std::function<void(const Dict&)>& write) {
  Dict root = new_dict();
  root.insert("format_version", c.optimizer_shards ? Checkpoint::kShardedFormatVersion : c.format_version);
  root.insert("torch_version", c.torch_version.empty() ? std::string(TORCH_VERSION) : c.torch_version);
  insert_state(root, c, form);

  Dict extra = new_dict();
  extra.insert("num_updates", c.num_updates);
  extra.insert("epoch", c.epoch);
  extra.insert("offset", c.offset);
  extra.insert("meters", double_map(c.meters));
  // None when there is no generator state: an undefined tensor has no bytes to checksum or pickle.
  extra.insert("rng_state", c.rng_state.defined() ? c10::IValue(form(c.rng_state)) : c10::IValue());
  extra.insert("best", c.best ? c10::IValue(*c.best) : c10::IValue());
  Dict plan = new_dict();
  plan.insert("batch_sizes", int_list(c.data_plan.batch_sizes));
  plan.insert("update_freqs", int_list(c.data_plan.update_freqs));
  plan.insert("shares", int_list(c.data_plan.shares));
  extra.insert("data_plan", plan);
  c10::impl::GenericList layout(c10::AnyType::get());
  for (const auto& bucket : c.bucket_layout) layout.push_back(int_list(bucket));
  extra.insert("bucket_layout", layout);
  c10::impl::GenericList cuda_rng(c10::AnyType::get());
  for (const auto& state : c.cuda_rng_states) cuda_rng.push_back(form(state));
  extra.insert("cuda_rng_state", cuda_rng);
  if (c.powersgd) extra.insert("powersgd", powersgd_entry(*c.powersgd, form));
  root.insert("extra_state", extra);

  Dict args = new_dict();
  args.insert("task", c.task);
  args.insert("model_digest", c.model_digest);
  args.insert("options", c.options);
  root.insert("args", args);

  root.insert("checksum", checksum_of(root, "checksum", tensors));
  write(root);
}

}  // namespace

std::vector<char> encode_checkpoint(const Checkpoint& c) {
  std::vector<char> bytes;
  with_checkpoint_tree(c, cpu_contiguous, nullptr, [&](const Dict& root) { bytes = detail::archive_bytes(root); });
  return bytes;
}

void encode_checkpoint(const Checkpoint& c, const std::function<bool(const void*, size_t)>& write) {
  detail::ArchiveTensors tensors;
  const TensorForm stage = [&](const torch::Tensor& t) { return tensors.stage(t); };
  with_checkpoint_tree(c, stage, &tensors, [&](const Dict& root) { detail::write_archive(root, tensors, write); });
}

namespace detail {

int64_t training_state_checksum(const Checkpoint& c) {
  Dict root = new_dict();
  insert_state(root, c, [](const torch::Tensor& t) { return t; });
  root.insert("num_updates", c.num_updates);
  root.insert("epoch", c.epoch);
  root.insert("offset", c.offset);
  Crc crc;
  crc.value(root);
  return crc.result();
}

}  // namespace detail

namespace {

// The `powersgd` entry, checked for the shapes that PowerSgd::load_state relies on.
PowerSgdState read_powersgd(const Reader& r, const Dict& d) {
  PowerSgdState p;
  p.update = r.integer(d, "update");
  p.world_size = r.integer(d, "world_size");
  if (p.world_size < 1 || p.update < -1) {
    r.fail(fmt::format("the PowerSGD state (update {}, {} ranks) is impossible", p.update, p.world_size));
  }
  const c10::IValue buckets = r.at(d, "buckets");
  if (!buckets.isList()) r.fail("the entry 'powersgd.buckets' is not a list");
  for (const c10::IValue& entry : buckets.toList()) {
    if (!entry.isGenericDict()) r.fail("the entry 'powersgd.buckets' is not a list of dicts");
    const Dict b = entry.toGenericDict();
    PowerSgdState::Bucket bucket;
    bucket.index = r.integer(b, "index");
    bucket.shapes = r.int_lists(b, "shapes");
    bucket.matrices = r.ints(b, "matrices");
    bucket.q = r.tensor_list(b, "q");
    bucket.errors = r.tensor_list(b, "errors");
    const size_t count = bucket.matrices.size();
    if (bucket.q.size() != count || !(bucket.errors.empty() || bucket.errors.size() == count)) {
      r.fail(fmt::format("PowerSGD bucket {} has {} matrices but {} Q and {} error tensors", bucket.index, count,
                         bucket.q.size(), bucket.errors.size()));
    }
    for (size_t k = 0; k < count; ++k) {
      const int64_t view = bucket.matrices[k];
      const bool known = view >= 0 && view < static_cast<int64_t>(bucket.shapes.size());
      const bool fits = known && bucket.q[k].dim() == 2 &&
                        (bucket.errors.empty() ||
                         (bucket.errors[k].dim() == 3 && bucket.errors[k].size(0) == p.world_size));
      if (!fits) {
        const std::string errors =
            bucket.errors.empty() ? std::string() : fmt::format("{}", fmt::join(bucket.errors[k].sizes(), ", "));
        r.fail(fmt::format("PowerSGD bucket {}, matrix {}: view {} of {}, Q of shape [{}], errors of shape [{}] for {} "
                           "ranks do not fit together",
                           bucket.index, k, view, bucket.shapes.size(), fmt::join(bucket.q[k].sizes(), ", "),
                           errors,
                           p.world_size));
      }
    }
    p.buckets.push_back(std::move(bucket));
  }
  return p;
}

}  // namespace

Checkpoint decode_checkpoint(const std::vector<char>& bytes, const std::string& source) {
  const Reader r(source);
  // The archive ends with the zip end-of-central-directory record (22 bytes, no comment). LibTorch's
  // reader recovers what it can from an archive cut short, so a truncated file must be caught here.
  static const char kEndOfArchive[] = {'P', 'K', 5, 6};
  if (bytes.size() < 22 || std::memcmp(bytes.data() + bytes.size() - 22, kEndOfArchive, 4) != 0) {
    r.fail(fmt::format("it has no end-of-archive record ({} bytes): the file is truncated", bytes.size()));
  }
  detail::LoadedArchive archive;
  try {
    archive = detail::load_archive(bytes);  // scanned first: see Note [Pickle scan]
  } catch (const std::exception& e) {
    r.fail(fmt::format("cannot be read as an archive ({})", first_line(e)));
  }
  if (!archive.damage.empty()) r.fail(fmt::format("its pickle (data.pkl) is damaged: {}", archive.damage));
  if (!archive.value.isGenericDict()) r.fail("the archive does not hold a dict");
  r.plain_values(archive.value, "", archive.record_sizes);
  const Dict root = archive.value.toGenericDict();
  const int64_t version = r.integer(root, "format_version");
  if (version != Checkpoint::kFormatVersion && version != Checkpoint::kShardedFormatVersion) {
    throw InputError(fmt::format("{}: checkpoint format version {}, but this hetseq reads versions {} and {}", source,
                                 version, Checkpoint::kFormatVersion, Checkpoint::kShardedFormatVersion));
  }
  const int64_t stored = r.integer(root, "checksum");
  const int64_t actual = checksum_of(root, "checksum");
  if (stored != actual) {
    throw InputError(fmt::format("{}: checksum mismatch (stored {:08x}, content {:08x}): the file was altered or "
                                 "damaged after it was written; use another checkpoint",
                                 source, stored, actual));
  }

  Checkpoint c;
  c.format_version = version;
  c.torch_version = r.text(root, "torch_version");
  for (const auto& e : r.dict(root, "model")) {
    if (!e.value().isTensor()) r.fail(fmt::format("model entry '{}' is not a tensor", e.key().toStringRef()));
    c.model.emplace_back(e.key().toStringRef(), e.value().toTensor());
  }
  const Dict optimizer = r.dict(root, "optimizer");
  c.optimizer_name = r.text(optimizer, "name");
  c.optimizer_options = r.doubles(optimizer, "options");
  if (optimizer.contains("state")) c.optimizer_state = r.tensors(optimizer, "state");
  if (optimizer.contains("loss_scaler")) c.loss_scaler = r.doubles(optimizer, "loss_scaler");
  if (optimizer.contains("shards") != (version == Checkpoint::kShardedFormatVersion)) {
    r.fail(fmt::format("format version {} {} the entry 'optimizer.shards'", version,
                       optimizer.contains("shards") ? "with" : "without"));
  }
  if (optimizer.contains("shards")) {
    const Dict shards = r.dict(optimizer, "shards");
    c.optimizer_shards = OptimizerShardsRef{r.text(shards, "save_id"), r.integer(shards, "world_size")};
    if (c.optimizer_shards->world_size < 1) r.fail("the entry 'optimizer.shards.world_size' is not positive");
  }
  const Dict scheduler = r.dict(root, "lr_scheduler");
  c.lr_scheduler_name = r.text(scheduler, "name");
  // Checkpoints of earlier versions name the schedule by its internal name, not by its flag value.
  if (c.lr_scheduler_name == "polynomial_decay") c.lr_scheduler_name = "PolynomialDecayScheduler";
  c.lr_scheduler_state = r.doubles(scheduler, "state");

  const Dict extra = r.dict(root, "extra_state");
  c.num_updates = r.integer(extra, "num_updates");
  c.epoch = r.integer(extra, "epoch");
  c.offset = r.integer(extra, "offset");
  c.meters = r.doubles(extra, "meters");
  if (const c10::IValue rng = r.at(extra, "rng_state"); rng.isTensor()) c.rng_state = rng.toTensor();
  if (const c10::IValue best = r.at(extra, "best"); best.isDouble()) c.best = best.toDouble();
  const Dict plan = r.dict(extra, "data_plan");
  c.data_plan.batch_sizes = r.ints(plan, "batch_sizes");
  c.data_plan.update_freqs = r.ints(plan, "update_freqs");
  if (plan.contains("shares")) c.data_plan.shares = r.ints(plan, "shares");
  if (extra.contains("bucket_layout")) c.bucket_layout = r.int_lists(extra, "bucket_layout");
  if (extra.contains("cuda_rng_state")) c.cuda_rng_states = r.tensor_list(extra, "cuda_rng_state");
  if (extra.contains("powersgd")) c.powersgd = read_powersgd(r, r.dict(extra, "powersgd"));
  if (c.num_updates < 0 || c.epoch < 1 || c.offset < 0) {
    r.fail(fmt::format("the position (epoch {}, offset {}, {} updates) is impossible", c.epoch, c.offset,
                       c.num_updates));
  }

  const Dict args = r.dict(root, "args");
  c.task = r.text(args, "task");
  c.model_digest = r.text(args, "model_digest");
  c.options = r.text(args, "options");
  return c;
}

}  // namespace hetseq
