#pragma once
/// The version of hetseq. HETSEQ_VERSION_* are the headers' version (CMake reads the project's version
/// from these lines); hetseq::version() is the version of the library that the program runs with (the
/// two differ when a program was built against other headers).

#define HETSEQ_VERSION_MAJOR 0
#define HETSEQ_VERSION_MINOR 2
#define HETSEQ_VERSION_PATCH 0
#define HETSEQ_VERSION_STRING "0.2.0"

namespace hetseq {

/// The linked library's version, "MAJOR.MINOR.PATCH".
const char* version();

}  // namespace hetseq
