# `accel tune`: its pure rules in cli_tests (test_tune_plan.cpp), runs of the real command (a program
# that runs out of memory above a micro batch, and the GPT example), and its errors.
target_sources(cli_tests PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/test_tune_plan.cpp)
add_executable(tune_program ${CMAKE_CURRENT_SOURCE_DIR}/tune_program.cpp)
target_include_directories(tune_program PRIVATE ${ACCEL_TESTS_DIR})
target_link_libraries(tune_program PRIVATE accel CLI11::CLI11)
accel_test_compile(tune_program)
set(_tune_dir ${CMAKE_BINARY_DIR}/tune_runs)
add_test(NAME cli_tune_no_program
         COMMAND ${ACCEL_EXPECT} fail "accel tune: error: name the program to tune: accel tune \\[flags\\] PROGRAM"
                 -- ${ACCEL_CLI} tune --time_limit 1)
add_test(NAME cli_tune_bad_dialect
         COMMAND ${ACCEL_EXPECT} fail "--dialect 'xml': accelerate \\(the YAML\\) or deepspeed \\(the JSON\\)"
                 -- ${ACCEL_CLI} tune --dialect xml $<TARGET_FILE:tune_program>)
add_test(NAME cli_tune_bad_checkpointing
         COMMAND ${ACCEL_EXPECT} fail "--checkpointing 'maybe': off, on or both"
                 -- ${ACCEL_CLI} tune --checkpointing maybe $<TARGET_FILE:tune_program>)
add_test(NAME cli_tune_not_a_program
         COMMAND ${ACCEL_EXPECT} fail "no_such_program is not an executable program"
                 -- ${ACCEL_CLI} tune ${_tune_dir}/no_such_program)
add_test(NAME cli_tune_bad_global_batch
         COMMAND ${ACCEL_EXPECT} fail "--global_batch 1 is smaller than the 2 ranks"
                 -- ${ACCEL_CLI} tune -n 2 --global_batch 1 --work_dir ${_tune_dir}/bad_batch
                    $<TARGET_FILE:tune_program> --batch 4)
set_tests_properties(cli_tune_no_program cli_tune_bad_dialect cli_tune_bad_checkpointing cli_tune_not_a_program
                     PROPERTIES TIMEOUT 60)
set_tests_properties(cli_tune_bad_global_batch PROPERTIES ENVIRONMENT "${ACCEL_LAUNCH_TEST_ENV}" TIMEOUT 120)
add_test(NAME cli_tune_out_of_memory_np2
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/tune_oom.sh ${ACCEL_CLI} $<TARGET_FILE:tune_program> ${_tune_dir}/oom)
set_tests_properties(cli_tune_out_of_memory_np2 PROPERTIES ENVIRONMENT "${ACCEL_LAUNCH_TEST_ENV}" TIMEOUT 300)
if(TARGET gpt_lm)
  add_test(NAME cli_tune_gpt_np2
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/tune_gpt.sh ${ACCEL_CLI} $<TARGET_FILE:gpt_lm> ${_tune_dir}/gpt)
  set_tests_properties(cli_tune_gpt_np2 PROPERTIES ENVIRONMENT "${ACCEL_LAUNCH_TEST_ENV}" TIMEOUT 600)
endif()
# Across two hosts made of network namespaces (tests/cli/multinode.cmake has the others): HYBRID_SHARD
# joins the grid and every run reports 2 nodes. Root and iproute2, else skipped. About 10 s.
if(TARGET gpt_lm)
  add_test(NAME cli_tune_multinode_netns
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/multinode_netns.sh
                   bash ${CMAKE_CURRENT_SOURCE_DIR}/tune_multinode.sh ${ACCEL_CLI} $<TARGET_FILE:gpt_lm>
                   ${_tune_dir}/multinode)
  set_tests_properties(cli_tune_multinode_netns PROPERTIES
                       ENVIRONMENT "${ACCEL_TEST_ENV}" TIMEOUT 600 SKIP_RETURN_CODE 77 LABELS multinode)
endif()
