#include "hetseq/version.h"

namespace hetseq {

const char* version() { return HETSEQ_VERSION_STRING; }

}  // namespace hetseq
