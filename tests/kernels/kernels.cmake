# accel::cpu_gemm (src/kernels/): float32 CPU products through oneDNN or libtorch. One process, no MPI.
# (include()d from tests/CMakeLists.txt: CMAKE_CURRENT_SOURCE_DIR is tests/.)
add_executable(kernels_tests kernels/test_cpu_gemm.cpp)
target_include_directories(kernels_tests PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})
target_link_libraries(kernels_tests PRIVATE accel GTest::gtest GTest::gtest_main)
accel_add_gtest(NAME kernels_cpu_gemm TARGET kernels_tests TIMEOUT 120)
