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
    # A light source compiles alone: merged into a unity batch it would load the precompiled header after all.
    set_source_files_properties(${light} TARGET_DIRECTORY ${target} PROPERTIES SKIP_PRECOMPILE_HEADERS ON
                                                                               SKIP_UNITY_BUILD_INCLUSION ON)
  endif()
endfunction()

# Note [Unity batches]
# What a heavy source costs beyond its own code is the precompiled <torch/torch.h>, loaded once per
# translation unit (about 5 s of CPU), and the code generated for the inline functions it uses from
# LibTorch, {fmt} and the standard library, generated again in every translation unit. With
# HETSEQ_UNITY_BUILD (on by default) hetseq_unity_batches(target) compiles a target's heavy sources
# HETSEQ_UNITY_BATCH at a time as one translation unit, so both are paid once per batch; the light ones
# (Note [Light sources skip the precompiled header]) stay alone. The batches are cut in the order of the
# sources, so a module's files share a batch only with files of the same module. What it asks of the code:
# names at file scope (anonymous namespaces, static functions, file-local constants) must not clash with
# those of another file of the same target, and a file must include what it uses rather than rely on a
# batch neighbour. A build with -DHETSEQ_UNITY_BUILD=OFF compiles every file alone and so checks the latter;
# it also suits a developer who edits one file at a time, since a unity build recompiles a touched file's
# whole batch.
function(hetseq_unity_batches target)
  if(HETSEQ_UNITY_BUILD)
    set_target_properties(${target} PROPERTIES UNITY_BUILD ON UNITY_BUILD_MODE BATCH
                                               UNITY_BUILD_BATCH_SIZE ${HETSEQ_UNITY_BATCH})
  endif()
endfunction()
