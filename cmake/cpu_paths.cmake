# The CPU paths: code compiled once per path with that path's flags, into namespace
# <...>::<path>, one path chosen at run time from the CPU's features or KVQ_CPU_PATH
# (kernels/cpu/isa.h, kernels/cpu/dispatch.cpp). Backend cpu's kernels (kernels/cpu/) and the
# model's packed products (model/packed_kernels.cpp) are built this way, so one binary runs on any
# x86-64 machine at that machine's best path. The flags first take away what a path must not use,
# so that flags a build adds to every source (CMAKE_CXX_FLAGS) cannot widen it. The AVX-512 paths
# are tuned for the Intel cores that run them (Ice Lake server; Sapphire Rapids, which AMD Zen 4/5
# share the path with): generic tuning cost 5-15% in bench_attention's exact mode on this
# project's Xeon.
if(CMAKE_SYSTEM_PROCESSOR MATCHES "^(x86_64|AMD64|amd64)$")
  set(KVQ_CPU_PATHS portable avx2 avx512 avx512bf16 CACHE INTERNAL "the CPU paths, widest last")
  set(KVQ_CPU_FLAGS_portable -march=x86-64 -mno-avx CACHE INTERNAL "")
  set(KVQ_CPU_FLAGS_avx2 -march=x86-64 -mno-avx512f -mno-avxvnni -mavx2 -mfma -mf16c
      CACHE INTERNAL "")
  set(KVQ_CPU_FLAGS_avx512 -march=x86-64-v4 -mno-avx512vbmi -mno-avx512bf16 -mno-amx-tile
      -mavx512vnni -mtune=icelake-server CACHE INTERNAL "")
  set(KVQ_CPU_FLAGS_avx512bf16 -march=x86-64-v4 -mno-avx512fp16 -mavx512vnni -mavx512vbmi
      -mavx512bf16 -mamx-tile -mamx-bf16 -mtune=sapphirerapids CACHE INTERNAL "")
else()
  set(KVQ_CPU_PATHS portable CACHE INTERNAL "the CPU paths, widest last")
  set(KVQ_CPU_FLAGS_portable "" CACHE INTERNAL "")
endif()

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

# kvq_cpu_path_sources(TARGET NAME SOURCES src... LIBS lib...): compiles SOURCES once per path
# (object library NAME_<path>, linked PRIVATE to LIBS) and adds each path's objects to TARGET as
# one relocatable object whose only global symbol is the path's table getter NAME_path_<path>, so
# nothing compiled with one path's instructions (inline functions, template instantiations) can be
# picked by the linker for other code.
function(kvq_cpu_path_sources target name)
  cmake_parse_arguments(A "" "" "SOURCES;LIBS" ${ARGN})
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
  endforeach()
endfunction()
