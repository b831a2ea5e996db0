# Mixed precision (src/mixed_precision/): the loss scaler, fp8 casting and the fp8 all-gather codec,
# Float8Linear, the loss in fp32 from low-precision logits (cross_entropy), the engine's fp8 all-gather of ZeRO-3 units. One GoogleTest binary on every rank; ctest runs it at 1, 2 and 3 ranks.
accel_test_binary(mixed_precision_tests
  test_loss_scaler.cpp
  test_fp8.cpp
  test_float8_linear.cpp
  test_fp8_all_gather.cpp
  test_cross_entropy.cpp
)
target_compile_definitions(mixed_precision_tests PRIVATE
  ACCEL_MP_TEST_DIR="${CMAKE_CURRENT_SOURCE_DIR}")
target_link_libraries(mixed_precision_tests PRIVATE accel_test_support)
if(ACCEL_PYTHON)
  # loss_scaler_reference.py (DeepSpeed's update_scale in Python) and float8_torchao_reference.py
  # (torchao's float8 training of one layer) are the independent references.
  target_compile_definitions(mixed_precision_tests PRIVATE ACCEL_PYTHON="${ACCEL_PYTHON}")
endif()
accel_add_mpi_test(NAME mixed_precision TARGET mixed_precision_tests NP 1 2 3)
accel_add_mpi_test(NAME mixed_precision_private TARGET mixed_precision_tests NP 2
                   FILTER -EngineFp8AllGather.HalfTheBytesOfBf16AndEachParameterIsItsMasterThroughE4m3
                   ENV ${ACCEL_PRIVATE_SHARDS})
