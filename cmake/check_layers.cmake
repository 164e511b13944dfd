# The layering of hetseq's modules, checked as part of the build (hetseq/CMakeLists.txt runs it before
# compiling each module): a file of module MODULE may include headers of MODULE itself and of the
# modules in ALLOWED (those below it), nothing above. An include that points up fails the build with
# the file, the header and the order.
#   cmake -DROOT=<source dir> -DMODULE=train -DALLOWED=core,data,... -DORDER=core,data,... -DSTAMP=<file> -P check_layers.cmake
cmake_minimum_required(VERSION 3.22)
string(REPLACE "," ";" ALLOWED "${ALLOWED}")
string(REPLACE "," ";" ORDER "${ORDER}")
file(GLOB_RECURSE files "${ROOT}/hetseq/${MODULE}/*.h" "${ROOT}/hetseq/${MODULE}/*.cpp")
# Headers at the top of hetseq/ belong to a module: version.h to core, optim.h to optim; hetseq.h is the
# public umbrella above every module, which no module includes.
set(top_version core)
set(top_optim optim)
set(errors "")
foreach(f IN LISTS files)
  file(STRINGS "${f}" lines REGEX "^[ \t]*#[ \t]*include[ \t]*[\"<]hetseq/")
  foreach(line IN LISTS lines)
    string(REGEX MATCH "[\"<](hetseq/[^\">]*)[\">]" _ "${line}")
    set(header "${CMAKE_MATCH_1}")
    set(module "(the public umbrella)")
    if(header MATCHES "^hetseq/([a-z_]+)/")
      set(module "${CMAKE_MATCH_1}")
    elseif(header MATCHES "^hetseq/([a-z_]+)\\.h$")
      if(DEFINED top_${CMAKE_MATCH_1})
        set(module "${top_${CMAKE_MATCH_1}}")
      endif()
    endif()
    if(NOT module STREQUAL MODULE AND NOT module IN_LIST ALLOWED)
      file(RELATIVE_PATH rel "${ROOT}" "${f}")
      string(APPEND errors "  ${rel} includes ${header} (module ${module})\n")
    endif()
  endforeach()
endforeach()
if(errors)
  string(REPLACE ";" " < " order "${ORDER}")
  string(REPLACE ";" ", " allowed "${ALLOWED}")
  if(allowed)
    set(allowed "only ${allowed}")
  else()
    set(allowed "no other module")
  endif()
  message(FATAL_ERROR "hetseq module '${MODULE}' includes a module above it:\n${errors}"
                      "The modules are layered ${order}: '${MODULE}' may include ${allowed} "
                      "(see docs/DESIGN.md, \"The map\"). Move the code to the module that may use it, or pass "
                      "it in from above (an interface or a callback).")
endif()
file(TOUCH "${STAMP}")
