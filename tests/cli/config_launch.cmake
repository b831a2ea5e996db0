# accel config and accel launch: their pure rules in cli_tests, and end-to-end scenarios that run the
# real binary as a user would (tests/cli/config_launch_checks.sh SCENARIO).
target_sources(cli_tests PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/test_launch_plan.cpp
                                 ${CMAKE_CURRENT_SOURCE_DIR}/test_config_command.cpp)
foreach(scenario ranks first_failure interrupt launch_errors dry_run binding config_flow config_errors explain_shipped)
  add_test(NAME cli_${scenario}
           COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/config_launch_checks.sh ${ACCEL_CLI} ${PROJECT_SOURCE_DIR} ${scenario})
  set_tests_properties(cli_${scenario} PROPERTIES ENVIRONMENT "${ACCEL_TEST_ENV}" TIMEOUT 300)
endforeach()
# benchmarks/torch_anchor.py (PyTorch) trains what step_bench trains: the same losses step by step,
# both started by accel launch (tests/cli/torch_anchor_parity.sh; skipped when ACCEL_PYTHON lacks torch).
if(ACCEL_BUILD_BENCHMARKS AND ACCEL_PYTHON)
  add_test(NAME cli_launch_torch_anchor_parity
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/torch_anchor_parity.sh ${ACCEL_CLI} $<TARGET_FILE:step_bench>
                   ${ACCEL_PYTHON} ${PROJECT_SOURCE_DIR})
  set_tests_properties(cli_launch_torch_anchor_parity PROPERTIES ENVIRONMENT "${ACCEL_TEST_ENV}" TIMEOUT 600
                       SKIP_RETURN_CODE 77)
endif()
# step_bench refuses what it would otherwise ignore (tests/cli/step_bench_refusals.sh), one rank.
if(ACCEL_BUILD_BENCHMARKS)
  add_test(NAME cli_step_bench_refusals
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/step_bench_refusals.sh $<TARGET_FILE:step_bench>)
  set_tests_properties(cli_step_bench_refusals PROPERTIES ENVIRONMENT "${ACCEL_TEST_ENV}" TIMEOUT 120)
endif()
# step_bench's model FLOPs and MFU against the closed form (tests/cli/mfu_check.sh), at 1 and 2 ranks.
if(ACCEL_BUILD_BENCHMARKS AND ACCEL_PYTHON)
  add_test(NAME cli_step_bench_mfu
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/mfu_check.sh ${ACCEL_CLI} $<TARGET_FILE:step_bench> ${ACCEL_PYTHON})
  set_tests_properties(cli_step_bench_mfu PROPERTIES ENVIRONMENT "${ACCEL_TEST_ENV}" TIMEOUT 300)
  # step_bench --profile: the engine's scopes counted per step and the Chrome traces (step_bench_profile.sh).
  add_test(NAME cli_step_bench_profile_np2
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/step_bench_profile.sh ${ACCEL_CLI} $<TARGET_FILE:step_bench>
                   ${ACCEL_PYTHON} ${CMAKE_BINARY_DIR}/step_bench_profile)
  set_tests_properties(cli_step_bench_profile_np2 PROPERTIES ENVIRONMENT "${ACCEL_LAUNCH_TEST_ENV}" TIMEOUT 300)
endif()
