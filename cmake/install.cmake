# `cmake --install`: the libraries as namespaced targets, one per component of the package
# (kvq::core, kvq::fp8, kvq::kivi, kvq::cache, kvq::reference, kvq::cpu, kvq::backend, kvq::model;
# kvq::cuda when built),
# their headers under <prefix>/include/kvq (included as "core/spec.h", "kernels/cpu/attention.h",
# ...), and in <prefix>/lib/cmake/kvq: kvqConfig.cmake for find_package(kvq [COMPONENTS ...]) and
# one targets file per component (kvq-<component>-targets.cmake), loaded only with the packages
# that component links (cmake/kvqConfig.cmake.in; README, "From C++"). Every exported target
# requires C++20 of its consumers (INTERFACE cxx_std_20). examples/consumer and tests/cmake use it.
include(CMakePackageConfigHelpers)

# Components in dependency order (each links only components before it): component=target.
set(kvq_exported core=kvq_core fp8=kvq_fp8 kivi=kvq_kivi cache=kvq_cache reference=kvq_reference
                 cpu=kvq_cpu)
# schemes: the families' params.h and families.def, which core/spec.h includes (".def" below)
set(kvq_header_dirs core schemes fp8 kivi cache reference_cpu kernels/cpu model)
if(KVQ_HAVE_CUDA)  # before backend, which links it (backend cuda)
  list(APPEND kvq_exported cuda=kvq_kernels)
  list(APPEND kvq_header_dirs kernels/cuda)
endif()
list(APPEND kvq_exported backend=kvq_backend model=kvq_model)
# The package that defines each imported target the libraries link, as kvqConfig.cmake finds it
# (target=find_package arguments; PCRE2 is pkg-config's libpcre2-8, found by kvqConfig.cmake;
# every CUDA::* target comes from CUDAToolkit).
set(kvq_packages "fmt::fmt=fmt" "nlohmann_json::nlohmann_json=nlohmann_json 3.10"
                 "Eigen3::Eigen=Eigen3 3.4 NO_MODULE" "Threads::Threads=Threads"
                 "OpenMP::OpenMP_CXX=OpenMP" "PkgConfig::PCRE2=PCRE2")

set(kvq_cmake_dir ${CMAKE_INSTALL_LIBDIR}/cmake/kvq)
set(kvq_components "")
set(kvq_component_table "")  # kvqConfig.cmake's @KVQ_COMPONENT_TABLE@
set(kvq_find_args "")        # package name -> find_package arguments, each package once
foreach(pair IN LISTS kvq_exported)
  string(REPLACE "=" ";" pair "${pair}")
  list(GET pair 0 name)
  list(GET pair 1 target)
  set_target_properties(${target} PROPERTIES EXPORT_NAME ${name})
  target_compile_features(${target} INTERFACE cxx_std_20)
  add_library(kvq::${name} ALIAS ${target})
  set(kvq_target_${target} ${name})

  # What the exported target links: kvq components before it, and imported targets of packages
  # (a static library's private ones too, as $<LINK_ONLY:...>; $<BUILD_INTERFACE:...> stays here).
  get_target_property(links ${target} INTERFACE_LINK_LIBRARIES)
  set(requires "")
  set(packages "")
  foreach(lib IN LISTS links)
    if(lib MATCHES "^\\$<LINK_ONLY:(.+)>$")
      set(lib "${CMAKE_MATCH_1}")
    endif()
    if(lib MATCHES "^\\$<BUILD_INTERFACE:" OR lib MATCHES "^::@")
      continue()
    endif()
    if(DEFINED kvq_target_${lib})
      list(APPEND requires ${kvq_target_${lib}})
      continue()
    endif()
    set(found "")
    if(lib MATCHES "^CUDA::")
      set(found CUDAToolkit)
    endif()
    foreach(entry IN LISTS kvq_packages)
      if(entry MATCHES "^([^=]+)=(.+)$" AND CMAKE_MATCH_1 STREQUAL lib)
        set(found "${CMAKE_MATCH_2}")
      endif()
    endforeach()
    if(found STREQUAL "")
      message(FATAL_ERROR "cmake/install.cmake: ${target} links '${lib}', neither a component "
                          "before it nor a target of kvq_packages: add its package there")
    endif()
    string(REPLACE " " ";" args "${found}")
    list(GET args 0 package)
    list(APPEND packages ${package})
    if(NOT DEFINED kvq_find_args_${package})
      set(kvq_find_args_${package} ${args})
      string(APPEND kvq_find_args "set(_kvq_find_${package} ${found})\n")
    endif()
  endforeach()
  list(REMOVE_DUPLICATES requires)
  list(REMOVE_DUPLICATES packages)
  list(APPEND kvq_components ${name})
  list(JOIN requires " " requires)
  list(JOIN packages " " packages)
  string(APPEND kvq_component_table "set(_kvq_${name}_requires ${requires})\n"
                                    "set(_kvq_${name}_packages ${packages})\n")

  install(TARGETS ${target} EXPORT kvq-${name}-targets COMPONENT dev
          ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
          LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
  install(EXPORT kvq-${name}-targets NAMESPACE kvq:: DESTINATION ${kvq_cmake_dir} COMPONENT dev)
endforeach()
list(JOIN kvq_components " " KVQ_COMPONENT_TABLE)
string(PREPEND KVQ_COMPONENT_TABLE "set(_kvq_components ")
string(APPEND KVQ_COMPONENT_TABLE ")\n${kvq_component_table}${kvq_find_args}")

foreach(dir IN LISTS kvq_header_dirs)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/${dir}/ COMPONENT dev
          DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/kvq/${dir}
          FILES_MATCHING PATTERN "*.h" PATTERN "*.cuh" PATTERN "*.def")
endforeach()
install(FILES ${PROJECT_SOURCE_DIR}/kernels/backend.h COMPONENT dev  # kvq::backend's one header
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/kvq/kernels)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/kvqConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/kvqConfig.cmake
                              INSTALL_DESTINATION ${kvq_cmake_dir})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/kvqConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/kvqConfig.cmake ${PROJECT_BINARY_DIR}/kvqConfigVersion.cmake
        DESTINATION ${kvq_cmake_dir} COMPONENT dev)
