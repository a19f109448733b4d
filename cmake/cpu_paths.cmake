# The CPU paths: code compiled once per path with that path's flags, into namespace
# <...>::<path>, one path chosen at run time from the CPU's features or KVQ_CPU_PATH
# (kernels/cpu/isa.h, kernels/cpu/dispatch.cpp). Backend cpu's kernels (kernels/cpu/) and the
# model's packed products (model/packed_kernels.cpp) are built this way, so one binary runs on any
# x86-64 machine at that machine's best path. The flags first take away what a path must not use,
# so that flags a build adds to every source (CMAKE_CXX_FLAGS) cannot widen it. The AVX-512 paths
# are tuned for the Intel cores that run them (Ice Lake server; Sapphire Rapids, which AMD Zen 4/5
# share the path with): generic tuning cost 5-15% in bench_attention's exact mode on this
# project's Xeon.
#
# KVQ_CPU_PATHS, the paths compiled: `all` (the default: one binary for any x86-64 CPU, and the
# cpu_path tests run every path this CPU has), `host` (portable and the widest this machine runs,
# from its compiler's -march=native: the asan and fuzz presets, whose programs never take another
# path), or a list of paths (portable is always in).
set(KVQ_CPU_PATHS all CACHE STRING "backend cpu's paths to compile: all, host, or a list")
if(CMAKE_SYSTEM_PROCESSOR MATCHES "^(x86_64|AMD64|amd64)$")
  set(kvq_cpu_all_paths portable avx2 avx512 avx512bf16)
  set(KVQ_CPU_FLAGS_portable -march=x86-64 -mno-avx CACHE INTERNAL "")
  set(KVQ_CPU_FLAGS_avx2 -march=x86-64 -mno-avx512f -mno-avxvnni -mavx2 -mfma -mf16c
      CACHE INTERNAL "")
  set(KVQ_CPU_FLAGS_avx512 -march=x86-64-v4 -mno-avx512vbmi -mno-avx512bf16 -mno-amx-tile
      -mavx512vnni -mtune=icelake-server CACHE INTERNAL "")
  set(KVQ_CPU_FLAGS_avx512bf16 -march=x86-64-v4 -mno-avx512fp16 -mavx512vnni -mavx512vbmi
      -mavx512bf16 -mamx-tile -mamx-bf16 -mtune=sapphirerapids CACHE INTERNAL "")
else()
  set(kvq_cpu_all_paths portable)
  set(KVQ_CPU_FLAGS_portable "" CACHE INTERNAL "")
endif()
if(KVQ_CPU_PATHS STREQUAL "all")
  set(kvq_selected ${kvq_cpu_all_paths})
elseif(KVQ_CPU_PATHS STREQUAL "host")
  set(kvq_selected portable)
  if(NOT kvq_cpu_all_paths STREQUAL "portable")
    execute_process(COMMAND ${CMAKE_CXX_COMPILER} -march=native -dM -E -x c++ /dev/null
                    OUTPUT_VARIABLE kvq_native ERROR_QUIET)
    # What each path needs, as kernels/cpu/dispatch.cpp's detect() asks the CPU for it.
    set(kvq_needs_avx2 __AVX2__ __FMA__ __F16C__)
    set(kvq_needs_avx512 ${kvq_needs_avx2} __BMI__ __BMI2__ __LZCNT__ __AVX512F__ __AVX512CD__
        __AVX512BW__ __AVX512DQ__ __AVX512VL__ __AVX512VNNI__)
    set(kvq_needs_avx512bf16 ${kvq_needs_avx512} __AVX512VBMI__ __AVX512BF16__)
    foreach(p avx2 avx512 avx512bf16)
      set(kvq_runs ON)
      foreach(m IN LISTS kvq_needs_${p})
        if(NOT kvq_native MATCHES "#define ${m} 1")
          set(kvq_runs OFF)
        endif()
      endforeach()
      if(kvq_runs)
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
# the getters, is compiled with KVQ_CPU_HAVE_<path> defined for each path built.
function(kvq_cpu_path_sources target name)
  cmake_parse_arguments(A "" "TABLES" "SOURCES;LIBS" ${ARGN})
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
    set_property(SOURCE ${A_TABLES} APPEND PROPERTY COMPILE_DEFINITIONS KVQ_CPU_HAVE_${p})
  endforeach()
endfunction()
