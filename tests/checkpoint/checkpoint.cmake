# save_state / load_state with the GPT example, as users run it (tests/checkpoint/resume_checks.sh):
# bitwise resume, resharding across strategies and world sizes (checked by an independent Python
# reader, tests/checkpoint/ckpt_tool.py), SIGKILL during a save, corrupted checkpoints.
if(ACCEL_BUILD_EXAMPLES)
  foreach(scenario bitwise reshard kill corrupt)
    add_test(NAME checkpoint_resume_${scenario}
             COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/checkpoint/resume_checks.sh ${MPIEXEC_EXECUTABLE} $<TARGET_FILE:gpt_lm>
                     ${PROJECT_SOURCE_DIR} ${ACCEL_PYTHON} ${CMAKE_BINARY_DIR}/checkpoint_runs ${scenario})
    set_tests_properties(checkpoint_resume_${scenario} PROPERTIES ENVIRONMENT "${ACCEL_TEST_ENV}" TIMEOUT 600)
  endforeach()
endif()
