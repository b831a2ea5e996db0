# Every third-party dependency, found in one place (docs/design.md, "Dependencies").

# libtorch from the pinned PyPI wheel: pass -DCMAKE_PREFIX_PATH=$(python -c 'import torch.utils;
# print(torch.utils.cmake_prefix_path)') (scripts/setup.sh does). The wheel is built with CUDA, so its
# CMake config needs the CUDA toolkit (nvcc) at configure time even for CPU-only use.
# accel has no .cu sources: keep torch's CUDA setup from probing for GPUs (try_run) and from asking
# nvcc for C++20, which CMake 3.25 cannot request from nvcc 13.
if(NOT DEFINED CMAKE_CUDA_STANDARD)
  set(CMAKE_CUDA_STANDARD 17)
endif()
if(NOT DEFINED TORCH_CUDA_ARCH_LIST AND NOT DEFINED ENV{TORCH_CUDA_ARCH_LIST})
  set(TORCH_CUDA_ARCH_LIST "8.0;9.0")
endif()
find_package(Torch REQUIRED)
message(STATUS "accel: libtorch ${Torch_VERSION} from ${Torch_DIR}")

find_package(MPI REQUIRED COMPONENTS C)
find_package(Threads REQUIRED)
# fmt: libtorch's include directory ships fmt 12 headers (and no fmt library), which shadow Debian's
# fmt 9 for every target that includes torch. So those headers are used, and their compiled half is
# built once into libaccel (src/base/fmt_impl.cpp) rather than header-only in every translation unit
# (FMT_HEADER_ONLY cost about 2 s per file that formats a message: 191 s against 124 s of compiling
# for the library). Targets that format link accel, which provides the symbols.
add_library(accel_fmt INTERFACE)
target_link_libraries(accel_fmt INTERFACE torch)
find_package(CLI11 REQUIRED)
find_package(spdlog REQUIRED)  # the library's logger (src/base/log.cpp)

# yaml-cpp 0.7 exports a target named `yaml-cpp` without a namespace; newer ones `yaml-cpp::yaml-cpp`.
find_package(yaml-cpp REQUIRED)
if(TARGET yaml-cpp AND NOT TARGET yaml-cpp::yaml-cpp)
  add_library(yaml-cpp::yaml-cpp ALIAS yaml-cpp)
endif()
find_package(nlohmann_json REQUIRED)
find_package(ZLIB REQUIRED)  # crc32 of checkpoint slices
# TensorBoard event files (src/tracking/tensorboard.cpp): protoc and libprotobuf-lite, the packaged ones.
find_package(Protobuf REQUIRED)

# liburing: the kernel's asynchronous I/O (io_uring) for offload files (src/offload/; README, "Offload to disk",
# "Disk I/O: why liburing"). pkg-config first, then a plain search (liburing.pc is missing on some systems).
find_package(PkgConfig QUIET)
if(PKG_CONFIG_FOUND)
  pkg_check_modules(LIBURING QUIET IMPORTED_TARGET liburing)
endif()
if(TARGET PkgConfig::LIBURING)
  add_library(accel_uring INTERFACE)
  target_link_libraries(accel_uring INTERFACE PkgConfig::LIBURING)
  set(_accel_uring_where "${LIBURING_VERSION} (pkg-config)")
else()
  find_path(LIBURING_INCLUDE_DIR liburing.h)
  find_library(LIBURING_LIBRARY NAMES uring)
  if(NOT LIBURING_INCLUDE_DIR OR NOT LIBURING_LIBRARY)
    message(FATAL_ERROR "accel: liburing not found (offload's asynchronous file I/O needs it). On Debian/Ubuntu: "
                        "apt-get install liburing-dev (scripts/setup.sh installs it); elsewhere install liburing "
                        "and pass -DCMAKE_PREFIX_PATH=<its prefix>.")
  endif()
  add_library(accel_uring INTERFACE)
  target_include_directories(accel_uring INTERFACE ${LIBURING_INCLUDE_DIR})
  target_link_libraries(accel_uring INTERFACE ${LIBURING_LIBRARY})
  set(_accel_uring_where "${LIBURING_LIBRARY}")
endif()
message(STATUS "accel: liburing ${_accel_uring_where}")

# NCCL backend: CUDA toolkit + NCCL (header and library), searched in the toolkit first, then the system,
# then the NCCL that the torch wheel depends on (the nvidia-nccl wheel beside it: nvidia/nccl/{include,lib},
# its library only as libnccl.so.2), so that a toolkit without NCCL still builds the backend.
set(ACCEL_HAVE_NCCL OFF)
if(ACCEL_WITH_NCCL)
  find_package(CUDAToolkit QUIET)
  if(CUDAToolkit_FOUND)
    get_filename_component(_accel_site_packages "${Torch_DIR}/../../../.." ABSOLUTE)
    find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} ${CUDAToolkit_LIBRARY_ROOT}/include
              PATHS ${_accel_site_packages}/nvidia/nccl/include)
    find_library(NCCL_LIBRARY NAMES nccl libnccl.so.2 HINTS ${CUDAToolkit_LIBRARY_DIR} ${CUDAToolkit_LIBRARY_ROOT}/lib64
                 PATHS ${_accel_site_packages}/nvidia/nccl/lib)
    if(NCCL_INCLUDE_DIR AND NCCL_LIBRARY)
      set(ACCEL_HAVE_NCCL ON)
      add_library(accel_nccl INTERFACE)
      target_include_directories(accel_nccl INTERFACE ${NCCL_INCLUDE_DIR})
      target_link_libraries(accel_nccl INTERFACE ${NCCL_LIBRARY} CUDA::cudart)
    endif()
  endif()
endif()
message(STATUS "accel: NCCL backend ${ACCEL_HAVE_NCCL} (${NCCL_LIBRARY})")

if(ACCEL_BUILD_TESTS)
  find_package(GTest REQUIRED)
endif()
