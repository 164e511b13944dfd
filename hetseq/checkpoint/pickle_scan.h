#pragma once
/// A check of a pickle's framing before LibTorch unpickles it. See Note [Pickle scan].

#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <ATen/core/ivalue.h>

namespace hetseq::detail {

// Note [Pickle scan]
// ~~~~~~~~~~~~~~~~~~
// LibTorch's unpickler trusts the lengths inside a pickle: a string whose 4-byte length says 1 GB makes it allocate
// (and zero) 1 GB before it finds that the archive ends a few bytes later, and one bit flipped in a checkpoint does
// that (found by fuzz/checkpoint_fuzz.cpp). A memo index has the same effect on its memo table. So before a
// checkpoint's pickle (data.pkl) reaches LibTorch, scan_pickle walks its opcodes (every opcode of pickle protocols
// 0-5, as Python's pickletools lists them) and checks their framing only:
//   - every argument lies inside the pickle: lengths (1, 4 or 8 bytes, as each opcode says) are compared with the
//     bytes left, and text arguments must end with their newline;
//   - memo indices are what a pickler writes: PUT numbers the memo in order (so an index is at most the number of
//     entries so far), GET names an entry that exists;
//   - the pickle ends with STOP, and an unknown opcode is an error.
// It builds nothing; what the values mean is still the unpickler's and then decode_checkpoint's to check.

/// Walks `pickle` as described in Note [Pickle scan]. Returns an empty string when its framing is sound, else what is
/// wrong (e.g. "opcode 'X' at byte 233 declares 1073741831 bytes, but 1001 are left").
std::string scan_pickle(std::string_view pickle);

/// A torch.save archive as decode_checkpoint reads it.
struct LoadedArchive {
  std::string damage;  // what scan_pickle found wrong with data.pkl; nothing was unpickled then
  c10::IValue value;   // the value tree, read as torch::pickle_load reads it (when `damage` is empty)
  /// [storage data] the size of the record each tensor storage was read from. The unpickler sizes a storage by the
  /// element count in the pickle, not by its record, so a damaged pickle can describe a storage larger than the bytes
  /// behind it; decode_checkpoint compares the two.
  std::unordered_map<const void*, size_t> record_sizes;
};

/// Reads data.pkl of `archive` once (without copying the archive), checks it with scan_pickle (Note [Pickle scan]),
/// and unpickles it when its framing is sound. Throws (c10::Error) when `archive` is not such an archive.
LoadedArchive load_archive(const std::vector<char>& archive);

}  // namespace hetseq::detail
