# Sanitizer and fuzzing builds (scripts/sanitize.sh, scripts/fuzz.sh; docs/RELIABILITY.md).
#   HETSEQ_SANITIZE  sanitizers for every hetseq target, as -fsanitize takes them (e.g. address,undefined); UBSan
#                    findings stop the program (-fno-sanitize-recover). LibTorch, HDF5 and the other prebuilt
#                    libraries stay uninstrumented.
#   HETSEQ_FUZZ      build the libFuzzer harnesses of fuzz/ (clang only); every hetseq target gets libFuzzer's
#                    coverage instrumentation, and HETSEQ_SANITIZE defaults to address,undefined.
option(HETSEQ_FUZZ "Build the libFuzzer harnesses of fuzz/ (clang only)" OFF)
set(HETSEQ_SANITIZE "" CACHE STRING "Sanitizers for every hetseq target, e.g. address,undefined (empty: none)")

if(HETSEQ_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "HETSEQ_FUZZ needs clang (libFuzzer): configure with CXX=clang++ (scripts/fuzz.sh does)")
  endif()
  if(HETSEQ_SANITIZE STREQUAL "")
    set(HETSEQ_SANITIZE "address,undefined" CACHE STRING "" FORCE)
  endif()
  add_compile_options(-fsanitize=fuzzer-no-link)
endif()

if(NOT HETSEQ_SANITIZE STREQUAL "")
  # Line tables only: symbolized reports without the size and link time of full debug information.
  if(CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    set(_hetseq_debug_lines -gline-tables-only)
  else()
    set(_hetseq_debug_lines -g1)
  endif()
  add_compile_options(-fsanitize=${HETSEQ_SANITIZE} -fno-sanitize-recover=all -fno-omit-frame-pointer
                      ${_hetseq_debug_lines})
  add_link_options(-fsanitize=${HETSEQ_SANITIZE})
  message(STATUS "hetseq: sanitizers ${HETSEQ_SANITIZE}, fuzz harnesses: ${HETSEQ_FUZZ}")
endif()
