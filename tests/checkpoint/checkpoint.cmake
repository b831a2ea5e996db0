# save_state / load_state with the GPT example, as users run it (tests/checkpoint/resume_checks.sh):
# bitwise resume, resharding across strategies and world sizes (checked by an independent Python
# reader, tests/checkpoint/ckpt_tool.py), SIGKILL during a save, a run killed 3 times under accel launch
# --max_restarts --auto_resume, a rank that stops answering (SIGSTOP), corrupted checkpoints, and
# accel merge-weights on checkpoints saved that way.
if(ACCEL_BUILD_EXAMPLES)
  foreach(scenario bitwise reshard kill restarts hang corrupt merge)
    add_test(NAME checkpoint_resume_${scenario}
             COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/resume_checks.sh ${ACCEL_LAUNCH} $<TARGET_FILE:gpt_lm>
                     ${PROJECT_SOURCE_DIR} ${ACCEL_PYTHON} ${CMAKE_BINARY_DIR}/checkpoint_runs ${scenario})
    set_tests_properties(checkpoint_resume_${scenario} PROPERTIES ENVIRONMENT "${ACCEL_LAUNCH_TEST_ENV}" TIMEOUT 600)
  endforeach()
endif()

# In-process round trips at 1-3 ranks (every optimizer's state under every strategy, a failed
# load that changes nothing, automatic naming, the total limit, registered objects), and sharded
# construction (Accelerator::sharded_init).
accel_test_binary(checkpoint_tests test_checkpoint.cpp)
target_link_libraries(checkpoint_tests PRIVATE nlohmann_json::nlohmann_json)
accel_add_mpi_test(NAME checkpoint TARGET checkpoint_tests NP 1 2 3 4)
accel_add_mpi_test(NAME checkpoint_private TARGET checkpoint_tests NP 2 3 4 ENV ${ACCEL_PRIVATE_SHARDS})
