// TensorBoard event files, encoded with Debian's protobuf. Compiled in the hetseq_tensorboard target, which
// does not see LibTorch's include paths (see hetseq/CMakeLists.txt).
#include "hetseq/observe/tensorboard/event_file_writer.h"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <stdexcept>
#include <system_error>

#include <boost/crc.hpp>

#include "observe/tensorboard/tensorboard_event.pb.h"  // generated from tensorboard_event.proto

namespace hetseq::tensorboard {

namespace {

// Note [TFRecord framing]
// An event file is a sequence of records, each one serialized Event:
//   uint64 length | uint32 masked_crc(the 8 length bytes) | data[length] | uint32 masked_crc(data)
// Integers are little-endian, the CRC is CRC32C (Castagnoli), and masked_crc(x) = ((c >> 15) | (c << 17))
// + 0xa282ead8 with c = crc32c(x), in uint32 arithmetic. TensorBoard's reader checks both CRCs.
uint32_t masked_crc32c(const char* data, size_t size) {
  boost::crc_optimal<32, 0x1EDC6F41, 0xFFFFFFFF, 0xFFFFFFFF, true, true> crc;
  crc.process_bytes(data, size);
  const uint32_t c = crc.checksum();
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

void append_little_endian(std::string& out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

// One record around `data`. See Note [TFRecord framing].
std::string frame_record(const std::string& data) {
  std::string record;
  record.reserve(data.size() + 16);
  append_little_endian(record, data.size(), 8);
  append_little_endian(record, masked_crc32c(record.data(), 8), 4);
  record += data;
  append_little_endian(record, masked_crc32c(data.data(), data.size()), 4);
  return record;
}

std::string host_name() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

double unix_seconds_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::atomic<int64_t> g_files_opened{0};  // makes the names of this process's files unique

}  // namespace

struct EventFileWriter::Impl {
  std::string logdir;
  std::string path;
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> file{nullptr, &std::fclose};

  [[noreturn]] void fail(const char* what) const {
    const int error = errno;  // before anything else can change it
    throw std::runtime_error("--tensorboard-logdir " + logdir + ": cannot " + what + " event file " + path + " (" +
                             std::generic_category().message(error) + "); choose a writable directory with free space");
  }

  void write_event(const proto::Event& event) {
    std::string data;
    if (!event.SerializeToString(&data)) throw std::logic_error("tensorboard: cannot serialize an Event");
    const std::string record = frame_record(data);
    if (std::fwrite(record.data(), 1, record.size(), file.get()) != record.size()) fail("write");
  }

  void flush() {
    if (std::fflush(file.get()) != 0) fail("flush");
  }
};

EventFileWriter::EventFileWriter(const std::string& logdir) : impl_(std::make_unique<Impl>()) {
  impl_->logdir = logdir;
  std::error_code ec;
  std::filesystem::create_directories(logdir, ec);
  if (ec) {
    throw std::runtime_error("--tensorboard-logdir " + logdir + ": cannot create the directory (" + ec.message() +
                             "); choose a writable directory");
  }
  impl_->path = (std::filesystem::path(logdir) / ("events.out.tfevents." + std::to_string(std::time(nullptr)) +
                                                  "." + host_name() + "." + std::to_string(getpid()) + "." +
                                                  std::to_string(g_files_opened++)))
                    .string();
  impl_->file.reset(std::fopen(impl_->path.c_str(), "wbx"));  // x: never truncate another writer's file
  if (!impl_->file) impl_->fail("open");

  proto::Event event;
  event.set_wall_time(unix_seconds_now());
  event.set_file_version("brain.Event:2");
  impl_->write_event(event);
  impl_->flush();
}

EventFileWriter::~EventFileWriter() = default;

void EventFileWriter::add_scalar(const std::string& tag, double value, int64_t step, double wall_time_s) {
  proto::Event event;
  event.set_wall_time(wall_time_s);
  event.set_step(step);
  proto::Summary::Value* scalar = event.mutable_summary()->add_value();
  scalar->set_tag(tag);
  scalar->set_simple_value(static_cast<float>(value));
  impl_->write_event(event);
}

void EventFileWriter::flush() { impl_->flush(); }

const std::string& EventFileWriter::path() const { return impl_->path; }

}  // namespace hetseq::tensorboard
