# The fused CPU optimizer step (src/optim/) against torch::optim, bit for bit. One process, no MPI.
# (include()d from tests/CMakeLists.txt: CMAKE_CURRENT_SOURCE_DIR is tests/.)
add_executable(optim_tests optim/test_fused_step.cpp)
target_include_directories(optim_tests PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})
target_link_libraries(optim_tests PRIVATE accel GTest::gtest GTest::gtest_main)
# Under each kernel family ATen can dispatch to (ATEN_CPU_CAPABILITY; ATen falls back to what the CPU
# has): the fused step follows ATen's choice, with FMA or without, and must match it in each.
accel_add_gtest(NAME optim_fused_step TARGET optim_tests TIMEOUT 300)
accel_add_gtest(NAME optim_fused_step_aten_avx2 TARGET optim_tests TIMEOUT 300 ENV ATEN_CPU_CAPABILITY=avx2)
accel_add_gtest(NAME optim_fused_step_aten_default TARGET optim_tests TIMEOUT 300 ENV ATEN_CPU_CAPABILITY=default)
