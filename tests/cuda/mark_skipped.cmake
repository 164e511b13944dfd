# Read by ctest (tests/CMakeLists.txt adds it to TEST_INCLUDE_FILES, after the file of Catch's discovered
# tests, which sets hetseq-tests_TESTS): a CUDA test ("CUDA: ..." names, tests/cuda/) that printed the
# skip warning of tests/cuda/cuda_skip.h is reported as skipped, not passed.
#
# On a machine with no NVIDIA device (no /dev/nvidia0) the CUDA tests run as one ctest test, "CUDA tests
# on a machine without a device", which runs them all in one process and passes when none of them failed
# (Catch2's exit code) (a start of the test binary costs about 0.65 s of CPU; there are about 20 of them); the tests
# one by one are then listed as disabled. HETSEQ_CUDA_TESTS_ONE_BY_ONE=1 runs them one by one anyway.
set(_hetseq_cuda_tests "")
foreach(_hetseq_test IN LISTS hetseq-tests_TESTS)
  if(_hetseq_test MATCHES "^CUDA: ")
    list(APPEND _hetseq_cuda_tests "${_hetseq_test}")
    set_tests_properties("${_hetseq_test}" PROPERTIES SKIP_REGULAR_EXPRESSION "\\[cuda\\] skipped:")
  endif()
endforeach()
list(LENGTH _hetseq_cuda_tests _hetseq_cuda_count)
if(_hetseq_cuda_count GREATER 0 AND NOT EXISTS /dev/nvidia0 AND NOT "$ENV{HETSEQ_CUDA_TESTS_ONE_BY_ONE}" STREQUAL "1")
  foreach(_hetseq_test IN LISTS _hetseq_cuda_tests)
    set_tests_properties("${_hetseq_test}" PROPERTIES DISABLED TRUE)
  endforeach()
  # HETSEQ_TESTS_BINARY, HETSEQ_TEST_RUN: the test binary's path and its client's (tests/CMakeLists.txt writes it into a file read before this one).
  add_test("CUDA tests on a machine without a device" "${HETSEQ_TEST_RUN}" "${HETSEQ_TESTS_BINARY}" "[cuda]")
  set_tests_properties("CUDA tests on a machine without a device" PROPERTIES TIMEOUT 600
                       FAIL_REGULAR_EXPRESSION "No test cases matched" FIXTURES_REQUIRED hetseq_zygote)
endif()
