# Read by ctest (tests/CMakeLists.txt adds it to TEST_INCLUDE_FILES after the file of Catch's discovered tests,
# which sets hetseq-tests_TESTS): the discovered tests that take about 15 s or more under ctest -j3 on 2 cores
# get their seconds as COST, so that they start first also in a new build directory, where ctest has no times
# of an earlier run (it orders later runs by the times it recorded). A test that ends last alone sets the
# suite's time. Each entry is the start of a test's name and its seconds (a fresh clone's ctest, 2026-11-28).
set(_hetseq_long_tests
  "torchrun elastic: when one of two agents dies" 26
  "SIGKILL of rank 1 of 3 at each save point" 19
  "Sitting out: a rank that becomes fast again" 19
  "a streamed save of more than 1 GiB" 18
  "Sharding full with update-freqs 2/1/1" 17
  "a rank given another secret or none" 16
  "A sharded checkpoint (os, os+grad or full" 15
  "Slurm: scripts/slurm/hetseq.sbatch" 14
  "Sitting out: SIGKILL of the rank that sits out" 13
  "Sitting out: SIGKILL of rank 0" 13
  "torchrun restarts the workers after one is killed" 13
  "a checkpoint save blocked three times longer" 13
  "Sharding os, os+grad and full with budgets 1:1:2" 12
  "Auto-balance: fp16 loss scaling and validation" 11
  "Slurm: srun --ntasks 2" 11)
list(LENGTH _hetseq_long_tests _hetseq_count)
math(EXPR _hetseq_last "${_hetseq_count} - 1")
foreach(_hetseq_test IN LISTS hetseq-tests_TESTS)
  foreach(_hetseq_i RANGE 0 ${_hetseq_last} 2)
    list(GET _hetseq_long_tests ${_hetseq_i} _hetseq_start)
    string(FIND "${_hetseq_test}" "${_hetseq_start}" _hetseq_at)
    if(_hetseq_at EQUAL 0)
      math(EXPR _hetseq_j "${_hetseq_i} + 1")
      list(GET _hetseq_long_tests ${_hetseq_j} _hetseq_cost)
      set_tests_properties("${_hetseq_test}" PROPERTIES COST ${_hetseq_cost})
    endif()
  endforeach()
endforeach()
