#include "hetseq/observe/op_counter.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <ATen/record_function.h>
#include <ATen/core/ivalue.h>

#include "hetseq/core/error.h"

namespace hetseq {

struct OpCounterAccess {
  static std::atomic<int64_t>& ops(OpCounter& c) { return c.ops_; }
  static std::atomic<int64_t>& reads(OpCounter& c) { return c.host_reads_; }
  static std::atomic<int64_t>& top(OpCounter& c) { return c.top_ops_; }
};

namespace {

std::atomic<OpCounter*> active{nullptr};
/// An ATen operator running on this thread, and whether it is a host read.
struct OpenOp {
  const char* name;
  bool read;
};
thread_local std::vector<OpenOp> open_ops;  // [depth]
// HETSEQ_HOST_READ_TRACE=1: each counted read is printed with the operators it runs inside.
const bool trace_reads = std::getenv("HETSEQ_HOST_READ_TRACE") != nullptr;

/// Marks an operator that on_start pushed onto open_ops, for on_end to pop.
struct OpContext final : at::ObserverContext {};

std::optional<size_t> argument(const c10::FunctionSchema& schema, std::string_view name) {
  const auto& args = schema.arguments();
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i].name() == name) return i;
  }
  return std::nullopt;
}

bool is_cpu_tensor(const c10::IValue& v) { return v.isTensor() && v.toTensor().defined() && v.toTensor().is_cpu(); }

bool blocking(const c10::FunctionSchema& schema, c10::ArrayRef<const c10::IValue> inputs) {
  const auto i = argument(schema, "non_blocking");
  return !i || *i >= inputs.size() || !inputs[*i].isBool() || !inputs[*i].toBool();
}

/// Whether `fn` makes the host wait for a device value. See Note [Counting operators].
bool is_host_read(const at::RecordFunction& fn) {
  const std::string_view name = fn.name();
  if (name == "aten::_local_scalar_dense" || name == "aten::nonzero" || name == "aten::masked_select" ||
      name == "aten::_unique" || name == "aten::_unique2" || name == "aten::unique_dim" ||
      name == "aten::unique_consecutive" || name == "aten::unique_dim_consecutive") {
    return true;
  }
  const bool conversion = name == "aten::to" || name == "aten::_to_copy";
  if (!conversion && name != "aten::copy_") return false;
  const std::optional<c10::FunctionSchema> schema = fn.operator_schema();
  if (!schema) return false;
  const c10::ArrayRef<const c10::IValue> inputs = fn.inputs();
  if (!blocking(*schema, inputs)) return false;
  if (!conversion) {  // copy_(self, src): into host memory from a device
    return inputs.size() >= 2 && is_cpu_tensor(inputs[0]) && inputs[1].isTensor() && inputs[1].toTensor().defined() &&
           !inputs[1].toTensor().is_cpu();
  }
  if (const auto d = argument(*schema, "device"); d && *d < inputs.size() && inputs[*d].isDevice()) {
    if (!inputs[*d].toDevice().is_cpu() || inputs.empty() || !inputs[0].isTensor()) return false;
    const at::Tensor& self = inputs[0].toTensor();
    if (!self.defined() || !self.is_cpu()) return true;  // from a device to the host
    // From the host to the host: a read where it only moves the tensor to the CPU, as the same call does on a
    // GPU (autocast's casts name the CPU too, and change the dtype).
    const auto t = argument(*schema, "dtype");
    return !t || *t >= inputs.size() || inputs[*t].isNone() ||
           (inputs[*t].isInt() && static_cast<c10::ScalarType>(inputs[*t].toInt()) == self.scalar_type());
  }
  if (const auto o = argument(*schema, "other"); o && *o < inputs.size()) {
    return is_cpu_tensor(inputs[*o]) && !inputs.empty() && !is_cpu_tensor(inputs[0]);
  }
  return false;
}

/// Whether a read starting now counts: called by the program, not inside another operator's implementation
/// (every open operator only wraps a read: item, is_nonzero), and not inside a read that counted already.
bool counts_as_new_read() {
  for (const OpenOp& op : open_ops) {
    const std::string_view name = op.name;
    if (op.read || (name != "aten::item" && name != "aten::is_nonzero")) return false;
  }
  return true;
}

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  OpCounter* counter = active.load(std::memory_order_acquire);
  if (counter == nullptr || std::strncmp(fn.name(), "aten::", 6) != 0) return nullptr;
  OpCounterAccess::ops(*counter).fetch_add(1, std::memory_order_relaxed);
  if (open_ops.empty()) OpCounterAccess::top(*counter).fetch_add(1, std::memory_order_relaxed);
  const bool read = is_host_read(fn);
  if (read && counts_as_new_read()) {
    OpCounterAccess::reads(*counter).fetch_add(1, std::memory_order_relaxed);
    if (trace_reads) {
      std::string inside;
      for (const OpenOp& op : open_ops) inside += std::string(" < ") + op.name;
      std::fprintf(stderr, "[host read] %s%s\n", fn.name(), inside.c_str());
    }
  }
  open_ops.push_back({fn.name(), read});
  return std::make_unique<OpContext>();
}

void on_end(const at::RecordFunction& /*fn*/, at::ObserverContext* context) {
  if (context != nullptr) open_ops.pop_back();
}

}  // namespace

OpCounter::OpCounter() {
  OpCounter* expected = nullptr;
  HETSEQ_ASSERT(active.compare_exchange_strong(expected, this), "two OpCounters at once");
  handle_ = at::addThreadLocalCallback(
      at::RecordFunctionCallback(on_start, on_end).needsInputs(true).scopes({at::RecordScope::FUNCTION}));
}

OpCounter::~OpCounter() {
  at::removeCallback(handle_);
  active.store(nullptr, std::memory_order_release);
}

OpCounter::OnThread::OnThread(OpCounter& counter) {
  HETSEQ_ASSERT(active.load(std::memory_order_acquire) == &counter, "OpCounter::OnThread with a counter not active");
  handle_ = at::addThreadLocalCallback(
      at::RecordFunctionCallback(on_start, on_end).needsInputs(true).scopes({at::RecordScope::FUNCTION}));
}

OpCounter::OnThread::~OnThread() { at::removeCallback(handle_); }

void OpCounter::reset() {
  ops_.store(0, std::memory_order_relaxed);
  top_ops_.store(0, std::memory_order_relaxed);
  host_reads_.store(0, std::memory_order_relaxed);
}

}  // namespace hetseq
