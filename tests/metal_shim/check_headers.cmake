# ctest muser_metal_shim: every src/cpp/muser/*.h must compile as Metal would
# see it. Each header gets a tiny translation unit that includes the shim and
# then the header, compiled with -fsyntax-only and no host standard library,
# so a host-only construct (std::, <cstring>, memcpy, a pointer passed without
# its address space) fails here, before anyone has a Mac.
#   cmake -DCOMPILER=<c++ compiler> -DSRC=<repo root> -DOUT=<scratch dir> -P check_headers.cmake
file(GLOB headers "${SRC}/src/cpp/muser/*.h")
if(NOT headers)
  message(FATAL_ERROR "no headers under ${SRC}/src/cpp/muser")
endif()
file(MAKE_DIRECTORY "${OUT}")
set(failed "")
# each header alone, then metal_uses.cpp: the templates instantiated as Metal kernels use them
set(units "")
foreach(h ${headers})
  get_filename_component(name "${h}" NAME_WE)
  set(tu "${OUT}/shim_${name}.cpp")
  file(WRITE "${tu}" "#include \"metal_shim.h\"\n#include \"muser/${name}.h\"\n")
  list(APPEND units "muser/${name}.h|${tu}")
endforeach()
list(APPEND units "metal_uses.cpp|${SRC}/tests/metal_shim/metal_uses.cpp")
foreach(unit ${units})
  string(REPLACE "|" ";" parts "${unit}")
  list(GET parts 0 name)
  list(GET parts 1 tu)
  execute_process(
    COMMAND "${COMPILER}" -std=c++17 -fsyntax-only -nostdinc -nostdinc++ -Werror=address
            -I "${SRC}/tests/metal_shim" -I "${SRC}/src/cpp" "${tu}"
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message("FAIL ${name} under the Metal shim:\n${out}${err}")
    list(APPEND failed "${name}")
  else()
    message("ok   ${name}")
  endif()
endforeach()
if(failed)
  message(FATAL_ERROR "not Metal-compilable: ${failed}")
endif()
