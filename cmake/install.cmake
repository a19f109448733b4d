# `cmake --install`: the libraries as namespaced targets (kvq::core, kvq::fp8, kvq::kivi,
# kvq::reference, kvq::cpu, kvq::model; kvq::cuda when built), their headers under
# <prefix>/include/kvq (included as "core/spec.h", "kernels/cpu/attention.h", ...), and
# <prefix>/lib/cmake/kvq/kvqConfig.cmake for find_package(kvq). examples/consumer uses it.
include(CMakePackageConfigHelpers)

set(kvq_exported core=kvq_core fp8=kvq_fp8 kivi=kvq_kivi reference=kvq_reference cpu=kvq_cpu
                 model=kvq_model)
set(kvq_header_dirs core fp8 kivi reference_cpu kernels/cpu model)
if(KVQ_HAVE_CUDA)
  list(APPEND kvq_exported cuda=kvq_kernels)
  list(APPEND kvq_header_dirs kernels/cuda)
endif()
set(kvq_install_targets "")
foreach(pair IN LISTS kvq_exported)
  string(REPLACE "=" ";" pair "${pair}")
  list(GET pair 0 name)
  list(GET pair 1 target)
  set_target_properties(${target} PROPERTIES EXPORT_NAME ${name})
  add_library(kvq::${name} ALIAS ${target})
  list(APPEND kvq_install_targets ${target})
endforeach()

install(TARGETS ${kvq_install_targets} EXPORT kvqTargets COMPONENT dev
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
foreach(dir IN LISTS kvq_header_dirs)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/${dir}/ COMPONENT dev
          DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/kvq/${dir}
          FILES_MATCHING PATTERN "*.h" PATTERN "*.cuh")
endforeach()
set(kvq_cmake_dir ${CMAKE_INSTALL_LIBDIR}/cmake/kvq)
install(EXPORT kvqTargets NAMESPACE kvq:: DESTINATION ${kvq_cmake_dir} COMPONENT dev)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/kvqConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/kvqConfig.cmake
                              INSTALL_DESTINATION ${kvq_cmake_dir})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/kvqConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/kvqConfig.cmake ${PROJECT_BINARY_DIR}/kvqConfigVersion.cmake
        DESTINATION ${kvq_cmake_dir} COMPONENT dev)
