// libFuzzer's entry point for every harness (-DHETSEQ_FUZZ=ON). See Note [Fuzz harnesses].
#include "fuzz/harness.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Rejected inputs stay in the corpus: the way to a deep bug often passes through inputs a reader refuses.
  hetseq::fuzz::run_input(data, size);
  return 0;
}
