# Read by ctest (tests/CMakeLists.txt adds it to TEST_INCLUDE_FILES, after the file of Catch's discovered
# tests, which sets hetseq-tests_TESTS): a CUDA test ("CUDA: ..." names, tests/cuda/) that printed the
# skip warning of tests/cuda/cuda_skip.h is reported as skipped, not passed.
foreach(_hetseq_test IN LISTS hetseq-tests_TESTS)
  if(_hetseq_test MATCHES "^CUDA: ")
    set_tests_properties("${_hetseq_test}" PROPERTIES SKIP_REGULAR_EXPRESSION "\\[cuda\\] skipped:")
  endif()
endforeach()
