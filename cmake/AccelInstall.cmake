# `cmake --install build --prefix P` installs the library, headers, the command and a CMake package:
#   find_package(accel REQUIRED)   # with CMAKE_PREFIX_PATH holding P and torch's cmake_prefix_path
#   target_link_libraries(app PRIVATE accel::accel)
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

install(TARGETS accel EXPORT accelTargets LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(TARGETS accel_cli accel_rank RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY src/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/accel FILES_MATCHING PATTERN "*.h")
install(FILES "${CMAKE_BINARY_DIR}/generated/accel/version.h" DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/accel)
install(EXPORT accelTargets NAMESPACE accel:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/accel)
configure_package_config_file(cmake/accelConfig.cmake.in "${CMAKE_BINARY_DIR}/accelConfig.cmake"
                              INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/accel)
write_basic_package_version_file("${CMAKE_BINARY_DIR}/accelConfigVersion.cmake" COMPATIBILITY SameMinorVersion)
install(FILES "${CMAKE_BINARY_DIR}/accelConfig.cmake" "${CMAKE_BINARY_DIR}/accelConfigVersion.cmake"
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/accel)
