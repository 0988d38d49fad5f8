# Installation: headers, the shared library, the CLI, exported CMake targets (strata::strata) with a
# package version file, and strata.pc for pkg-config.
include(CMakePackageConfigHelpers)

install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/strata DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS strata EXPORT strataTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
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
