# `cmake --install build --prefix P` installs the library, headers, the command and a CMake package:
#   find_package(accel REQUIRED)   # with CMAKE_PREFIX_PATH holding P and torch's cmake_prefix_path
#   target_link_libraries(app PRIVATE accel::accel)
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

install(TARGETS accel EXPORT accelTargets LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(TARGETS accel_cli accel_rank RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
# Every header but the internal ones: included only by .cpp files of src/ (never by an installed
# header, the examples or tests/install/consumer) and about how the library works inside, not what
# a program calls. (model_export.h and safetensors.h are included only by .cpp files too, but
# declare functions a program may call: installed.) tests/install/install_test.sh checks that every
# installed header's own includes are installed, and that the two below are not.
set(ACCEL_INTERNAL_HEADERS
  accelerator/config_detail.h  # the config parsers' shared helpers
  accelerator/precision.h      # how mixed_precision becomes the engine's dtypes (Accelerator::prepare)
  base/check.h                 # ACCEL_CHECK, for the library's own invariants
  base/env.h                   # the ACCEL_* table, read inside the library and by `accel env`
  base/files.h                 # POSIX file helpers of the launcher and checkpoints
  checkpoint/checkpoint_dir.h  # save_state's directories (Accelerator::save_state is the interface)
  checkpoint/sharded_state.h   # save_state's format
  checkpoint/slice_format.h    # ... and its slice records
  checkpoint/slice_reader.h    # ... and their reading (read_state, merge_weights)
  checkpoint/checkpoint_error.h
  accelerator/config_text.h    # the config parsers' text helpers
  comm/dtype.h
  comm/signature.h             # the cross-rank argument check's packing
  comm/cuda_comm.h
  offload/request_queue.h      # AsyncFile's queue (offload/async_file.h is the interface)
  optim/fused_kernels.h        # the fused step's per-ISA kernels (optim/fused_step.h is the interface)
  tracking/builtin.h           # the built-in trackers' factories (tracking/tracker.h is the interface)
  tracking/crc32c.h            # the event files' record checksums
  zero/unit_report.h)          # prepare's warning about the root unit (the Accelerator logs it)
set(_accel_header_excludes
    PATTERN "cli" EXCLUDE         # the `accel` command's internals (accel_cli_core is not installed)
    PATTERN "transport" EXCLUDE)  # comm/transport/: the transports below the Communicator (mpi, nccl, shm, staged)
foreach(h IN LISTS ACCEL_INTERNAL_HEADERS)
  list(APPEND _accel_header_excludes PATTERN "${h}" EXCLUDE)
endforeach()
install(DIRECTORY src/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/accel FILES_MATCHING PATTERN "*.h" ${_accel_header_excludes})
install(FILES "${CMAKE_BINARY_DIR}/generated/accel/version.h" DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/accel)
install(EXPORT accelTargets NAMESPACE accel:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/accel)
configure_package_config_file(cmake/accelConfig.cmake.in "${CMAKE_BINARY_DIR}/accelConfig.cmake"
                              INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/accel)
write_basic_package_version_file("${CMAKE_BINARY_DIR}/accelConfigVersion.cmake" COMPATIBILITY SameMinorVersion)
install(FILES "${CMAKE_BINARY_DIR}/accelConfig.cmake" "${CMAKE_BINARY_DIR}/accelConfigVersion.cmake"
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/accel)
