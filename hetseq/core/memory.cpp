#include "hetseq/core/memory.h"

#include <malloc.h>

namespace hetseq {

void keep_freed_memory() {
#if defined(__GLIBC__)
  // Both settings: fixing only the trim threshold also freezes the mmap threshold at its 128 KiB
  // default, and every tensor would be mmapped afresh.
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
#endif
}

}  // namespace hetseq
