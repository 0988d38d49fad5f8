# Installation: headers, the shared library, the CLI, exported CMake targets (strata::strata) with a
# package version file, and strata.pc for pkg-config.
include(CMakePackageConfigHelpers)

install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/strata DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS strata EXPORT strataTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
if(TARGET strata_cuda_plugin)
  # The CUDA backend's plugin beside the shared library, where libstrata.so looks for it first.
  install(TARGETS strata_cuda_plugin LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
  set(STRATA_PC_CUDA_PLUGIN "cuda_plugin=\${libdir}/libstrata-cuda.so")
else()
  set(STRATA_PC_CUDA_PLUGIN "")
endif()
if(TARGET strata_cli)
  install(TARGETS strata_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
  if(EXISTS ${PROJECT_SOURCE_DIR}/${STRATA_DEMO_MODEL})
    install(FILES ${PROJECT_SOURCE_DIR}/${STRATA_DEMO_MODEL} DESTINATION ${CMAKE_INSTALL_DATADIR}/strata)
  endif()
endif()
install(EXPORT strataTargets NAMESPACE strata:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/strata)

configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/strataConfig.cmake.in
  ${PROJECT_BINARY_DIR}/strataConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/strata)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/strataConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMajorVersion)
install(FILES ${PROJECT_BINARY_DIR}/strataConfig.cmake ${PROJECT_BINARY_DIR}/strataConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/strata)

configure_file(${PROJECT_SOURCE_DIR}/cmake/strata.pc.in ${PROJECT_BINARY_DIR}/strata.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/strata.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

# The static archive (the CPU backend; CUDA through its plugin) and strata-static.pc, which names
# the static archives of its dependencies: Abseil's in one linker group (their order then does not
# matter), liburing, libnuma.
install(TARGETS strata_static ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
find_library(STRATA_URING_ARCHIVE NAMES liburing.a)
find_library(STRATA_NUMA_ARCHIVE NAMES libnuma.a)
set(STRATA_STATIC_LIBS "")
if(STRATA_ABSL_ARCHIVES)
  list(JOIN STRATA_ABSL_ARCHIVES " " absl_joined)
  string(APPEND STRATA_STATIC_LIBS "-Wl,--start-group ${absl_joined} -Wl,--end-group")
endif()
if(URING_FOUND AND STRATA_URING_ARCHIVE)
  string(APPEND STRATA_STATIC_LIBS " ${STRATA_URING_ARCHIVE}")
elseif(URING_FOUND)
  string(APPEND STRATA_STATIC_LIBS " -luring")
endif()
if(NUMA_FOUND AND STRATA_NUMA_ARCHIVE)
  string(APPEND STRATA_STATIC_LIBS " ${STRATA_NUMA_ARCHIVE}")
elseif(NUMA_FOUND)
  string(APPEND STRATA_STATIC_LIBS " -lnuma")
endif()
configure_file(${PROJECT_SOURCE_DIR}/cmake/strata-static.pc.in ${PROJECT_BINARY_DIR}/strata-static.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/strata-static.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
