# Note [Light sources skip the precompiled header]
# Loading the precompiled <torch/torch.h> (about 700 MB with GCC) costs about 5 s of CPU per file, even for
# a file that uses nothing of LibTorch; parsing <torch/torch.h> itself costs about 16 s, <torch/types.h> 8 s,
# <ATen/core/Tensor.h> under 2 s, a c10 header under 1 s. So a file that reaches no LibTorch header heavier
# than those compiles faster without the precompiled header. hetseq_skip_pch_for_light_sources(target) marks
# such files of a target SKIP_PRECOMPILE_HEADERS, found at configure time by following the file's includes
# through the project's own headers. A file that later gains a heavy include still compiles, only slower
# until the next configure; a file that relied on the precompiled header for a standard header it does not
# include fails to compile and needs that include.
include_guard(GLOBAL)

# Sets ${out} to TRUE when ${file} reaches a heavy LibTorch header through the project's headers.
function(_hetseq_reaches_heavy_header file out)
  get_property(known GLOBAL PROPERTY "_hetseq_heavy:${file}" SET)
  if(known)
    get_property(heavy GLOBAL PROPERTY "_hetseq_heavy:${file}")
    set(${out} ${heavy} PARENT_SCOPE)
    return()
  endif()
  set_property(GLOBAL PROPERTY "_hetseq_heavy:${file}" FALSE)  # include cycles end here
  set(heavy FALSE)
  get_filename_component(dir "${file}" DIRECTORY)
  file(STRINGS "${file}" lines REGEX "^[ \t]*#[ \t]*include[ \t]*[\"<][^\">]+[\">]")
  foreach(line IN LISTS lines)
    string(REGEX MATCH "[\"<]([^\">]+)[\">]" _ "${line}")
    set(header "${CMAKE_MATCH_1}")
    if(header MATCHES "^(torch|ATen)/" AND NOT header STREQUAL "ATen/core/Tensor.h")
      set(heavy TRUE)
      break()
    endif()
    # The project's own headers: beside the file, or "hetseq/...", "tasks/...", "fuzz/...", "support/...".
    foreach(base IN ITEMS ${dir} ${PROJECT_SOURCE_DIR} ${PROJECT_SOURCE_DIR}/tests)
      if(EXISTS "${base}/${header}" AND NOT IS_DIRECTORY "${base}/${header}")
        get_filename_component(resolved "${base}/${header}" ABSOLUTE)
        _hetseq_reaches_heavy_header("${resolved}" sub)
        if(sub)
          set(heavy TRUE)
        endif()
        break()
      endif()
    endforeach()
    if(heavy)
      break()
    endif()
  endforeach()
  set_property(GLOBAL PROPERTY "_hetseq_heavy:${file}" ${heavy})
  set(${out} ${heavy} PARENT_SCOPE)
endfunction()

# KEEP: sources that keep the precompiled header although they look light (one that needs a standard header
# it does not include). CMake skips the precompiled header for a source whose SKIP_PRECOMPILE_HEADERS is set
# at all, even to OFF, so they are left out here.
function(hetseq_skip_pch_for_light_sources target)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "" "KEEP")
  list(TRANSFORM arg_KEEP PREPEND "${CMAKE_CURRENT_SOURCE_DIR}/")
  get_target_property(sources ${target} SOURCES)
  get_target_property(source_dir ${target} SOURCE_DIR)
  set(light "")
  set(sources_count 0)
  foreach(source IN LISTS sources)
    if(NOT source MATCHES "\\.(cpp|cc|cxx)$")
      continue()
    endif()
    math(EXPR sources_count "${sources_count} + 1")
    get_filename_component(path "${source}" ABSOLUTE BASE_DIR "${source_dir}")
    _hetseq_reaches_heavy_header("${path}" heavy)
    if(NOT heavy AND NOT path IN_LIST arg_KEEP)
      list(APPEND light "${path}")
    endif()
  endforeach()
  # CMake generates a precompiled header only for a target that has a source using it: the target that
  # owns it (not one that reuses another's) keeps it for one source.
  list(LENGTH light light_count)
  get_target_property(owned ${target} PRECOMPILE_HEADERS)
  if(owned AND light_count EQUAL sources_count)
    list(REMOVE_AT light 0)
  endif()
  if(light)
    set_source_files_properties(${light} TARGET_DIRECTORY ${target} PROPERTIES SKIP_PRECOMPILE_HEADERS ON)
  endif()
endfunction()
