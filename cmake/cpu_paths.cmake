# The CPU paths: code compiled once per path with that path's flags, into namespace
# <...>::<path>, one path chosen at run time from the CPU's features or KVQ_CPU_PATH
# (kernels/cpu/isa.h, kernels/cpu/dispatch.cpp). Backend cpu's kernels (kernels/cpu/) and the
# model's packed products (model/packed_kernels.cpp) are built this way, so one binary runs on any
# x86-64 machine at that machine's best path. What a path is (its name, flags, the CPU features
# it needs) is declared once, in kernels/cpu/paths.def, read here and by dispatch.cpp.
#
# KVQ_CPU_PATHS, the paths compiled: `all` (the default: one binary for any x86-64 CPU, and the
# cpu_path tests run every path this CPU has), `host` (portable and the widest this machine runs,
# from its compiler's -march=native: the asan and fuzz presets, whose programs never take another
# path), or a list of paths (portable is always in).
set(KVQ_CPU_PATHS all CACHE STRING "backend cpu's paths to compile: all, host, or a list")
set(kvq_paths_def ${PROJECT_SOURCE_DIR}/kernels/cpu/paths.def)
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${kvq_paths_def})
file(READ ${kvq_paths_def} kvq_def)
string(REGEX REPLACE "\"[ \t\r\n]+\"" "" kvq_def "${kvq_def}")  # "a" "b" is "ab", as in C++
string(REGEX MATCHALL "\nKVQ_CPU_FEATURE\\([^)]*\\)" kvq_entries "${kvq_def}")
foreach(e IN LISTS kvq_entries)
  string(REGEX MATCH "KVQ_CPU_FEATURE\\(([A-Z0-9_]+), *\"([^\"]*)\"" kvq_m "${e}")
  set(kvq_feature_macro_${CMAKE_MATCH_1} "${CMAKE_MATCH_2}")
endforeach()
set(kvq_cpu_all_paths "")
string(REGEX MATCHALL "\nKVQ_CPU_PATH\\([^)]*\\)" kvq_entries "${kvq_def}")
foreach(e IN LISTS kvq_entries)
  if(NOT e MATCHES "KVQ_CPU_PATH\\(([a-z0-9_]+),[ \n]*\"([^\"]*)\",[ \n]*\"([^\"]*)\",[ \n]*\"([^\"]*)\"\\)")
    message(FATAL_ERROR "kernels/cpu/paths.def: cannot read ${e} (KVQ_CPU_PATH(name, \"flags\", "
                        "\"needs\", \"uses\"))")
  endif()
  set(p ${CMAKE_MATCH_1})
  separate_arguments(kvq_flags UNIX_COMMAND "${CMAKE_MATCH_2}")
  separate_arguments(kvq_needs_${p} UNIX_COMMAND "${CMAKE_MATCH_3}")
  foreach(f IN LISTS kvq_needs_${p})
    if(NOT DEFINED kvq_feature_macro_${f})
      message(FATAL_ERROR "kernels/cpu/paths.def: path ${p} needs ${f}, which no KVQ_CPU_FEATURE "
                          "line declares")
    endif()
  endforeach()
  if(CMAKE_SYSTEM_PROCESSOR MATCHES "^(x86_64|AMD64|amd64)$")
    list(APPEND kvq_cpu_all_paths ${p})
    set(KVQ_CPU_FLAGS_${p} ${kvq_flags} CACHE INTERNAL "")
  elseif(p STREQUAL "portable")  # paths.def's paths are x86-64's; elsewhere portable, no flags
    list(APPEND kvq_cpu_all_paths ${p})
    set(KVQ_CPU_FLAGS_${p} "" CACHE INTERNAL "")
  endif()
endforeach()
if(NOT kvq_cpu_all_paths MATCHES "^portable")
  message(FATAL_ERROR "kernels/cpu/paths.def: the first path must be portable")
endif()
if(KVQ_CPU_PATHS STREQUAL "all")
  set(kvq_selected ${kvq_cpu_all_paths})
elseif(KVQ_CPU_PATHS STREQUAL "host")
  set(kvq_selected portable)
  if(NOT kvq_cpu_all_paths STREQUAL "portable")
    execute_process(COMMAND ${CMAKE_CXX_COMPILER} -march=native -dM -E -x c++ /dev/null
                    OUTPUT_VARIABLE kvq_native ERROR_QUIET)
    # The widest path whose every feature the compiler's -march=native targets (paths.def's
    # macros; a feature with none, such as OSXSAVE, counts as there).
    foreach(p IN LISTS kvq_cpu_all_paths)
      set(kvq_runs ON)
      foreach(f IN LISTS kvq_needs_${p})
        set(m "${kvq_feature_macro_${f}}")
        if(m AND NOT kvq_native MATCHES "#define ${m} 1")
          set(kvq_runs OFF)
        endif()
      endforeach()
      if(kvq_runs AND NOT p STREQUAL "portable")
        set(kvq_selected portable ${p})
      endif()
    endforeach()
  endif()
else()
  foreach(p IN LISTS KVQ_CPU_PATHS)
    if(NOT p IN_LIST kvq_cpu_all_paths)
      string(REPLACE ";" ", " kvq_names "${kvq_cpu_all_paths}")
      message(FATAL_ERROR "KVQ_CPU_PATHS: '${p}' is not a CPU path (paths: ${kvq_names}; or all, "
                          "host)")
    endif()
  endforeach()
  set(kvq_selected "")
  foreach(p IN LISTS kvq_cpu_all_paths)  # widest last, as the tables are ordered
    if(p STREQUAL "portable" OR p IN_LIST KVQ_CPU_PATHS)
      list(APPEND kvq_selected ${p})
    endif()
  endforeach()
endif()
# From here on KVQ_CPU_PATHS is the list (this variable hides the cache entry).
set(KVQ_CPU_PATHS ${kvq_selected})
message(STATUS "kvq: CPU paths ${KVQ_CPU_PATHS}")

# kvq_cpu_path_flags(TARGET PATH): compile TARGET's sources as PATH's (its flags and namespace),
# without the host's -march=native (KVQ_NATIVE). Also the per-path tests' (tests/kernels/cpu).
function(kvq_cpu_path_flags target p)
  get_target_property(opts ${target} COMPILE_OPTIONS)
  if(opts)
    list(FILTER opts EXCLUDE REGEX "-march=native")
    set_target_properties(${target} PROPERTIES COMPILE_OPTIONS "${opts}")
  endif()
  # -fno-gnu-unique (GCC): an inline function's static is a plain weak symbol, which the path
  # object makes local like the rest (objcopy leaves GNU unique symbols global).
  target_compile_options(${target} PRIVATE ${KVQ_CPU_FLAGS_${p}}
                         $<$<CXX_COMPILER_ID:GNU>:-fno-gnu-unique>)
  target_compile_definitions(${target} PRIVATE KVQ_CPU_PATH_NS=${p})
endfunction()

# The partial link takes GNU ld (ld.lld has no --force-group-allocation), whichever compiler.
find_program(KVQ_CPU_LD NAMES ld.bfd ld REQUIRED)

# kvq_cpu_path_sources(TARGET NAME SOURCES src... LIBS lib... TABLES src): compiles SOURCES once
# per path (object library NAME_<path>, linked PRIVATE to LIBS) and adds each path's objects to
# TARGET as one relocatable object whose only global symbol is the path's table getter
# NAME_path_<path>, so nothing compiled with one path's instructions (inline functions, template
# instantiations) can be picked by the linker for other code. TABLES, the TARGET source that lists
# the getters, is compiled with KVQ_CPU_BUILT defined as KVQ_CPU_BUILT_PATH(<path>) for each path
# built, in paths.def's order (an X-macro list).
function(kvq_cpu_path_sources target name)
  cmake_parse_arguments(A "" "TABLES" "SOURCES;LIBS" ${ARGN})
  set(built "")
  foreach(p IN LISTS KVQ_CPU_PATHS)
    add_library(${name}_${p} OBJECT ${A_SOURCES})
    target_link_libraries(${name}_${p} PRIVATE ${A_LIBS} kvq_warnings)
    kvq_cpu_path_flags(${name}_${p} ${p})
    set(obj ${CMAKE_CURRENT_BINARY_DIR}/${name}_${p}.o)
    add_custom_command(
      OUTPUT ${obj}
      COMMAND ${KVQ_CPU_LD} -r --force-group-allocation -o ${obj} $<TARGET_OBJECTS:${name}_${p}>
      COMMAND ${CMAKE_OBJCOPY} --keep-global-symbol=${name}_path_${p} ${obj}
      DEPENDS $<TARGET_OBJECTS:${name}_${p}>
      COMMAND_EXPAND_LISTS VERBATIM
      COMMENT "${name}: path ${p} as one object")
    target_sources(${target} PRIVATE ${obj})
    add_dependencies(${target} ${name}_${p})
    string(APPEND built "KVQ_CPU_BUILT_PATH(${p})")
  endforeach()
  set_property(SOURCE ${A_TABLES} APPEND PROPERTY COMPILE_DEFINITIONS "KVQ_CPU_BUILT=${built}")
endfunction()
