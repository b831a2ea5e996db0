# `accel bench` (the scaling report): its pure rules in cli_tests, runs of the real command (tests/cli/
# bench_*.sh; the JSONL and PNGs checked by bench_check.py against closed forms), and its errors.
target_sources(cli_tests PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/test_bench_plan.cpp)
set(_bench_dir ${CMAKE_BINARY_DIR}/bench_runs)
# Bad input: a clear message, exit status 2, nothing run.
add_test(NAME cli_bench_bad_num_processes
         COMMAND ${ACCEL_EXPECT} fail "--num_processes '1,x,4': 'x' is not a whole number of ranks"
                 "e\\.g\\. --num_processes 1,2,4" -- ${ACCEL_CLI} bench --num_processes 1,x,4 --out ${_bench_dir}/bad)
add_test(NAME cli_bench_missing_hostfile
         COMMAND ${ACCEL_EXPECT} fail "cannot read hostfile .*no_such_hostfile.*pass --hostfile a file of lines like"
                 -- ${ACCEL_CLI} bench --hostfile ${_bench_dir}/no_such_hostfile --out ${_bench_dir}/nohost)
set_tests_properties(cli_bench_bad_num_processes cli_bench_missing_hostfile PROPERTIES TIMEOUT 60)
if(ACCEL_BUILD_BENCHMARKS AND ACCEL_PYTHON)  # step_bench runs; matplotlib draws
  # 9 runs of a tiny GPT (DDP, ZeRO-2, ZeRO-3 at 1, 2, 4 ranks): about 15 s.
  add_test(NAME cli_bench_sweep_np124
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/bench_sweep.sh ${ACCEL_CLI} ${ACCEL_PYTHON} ${PROJECT_SOURCE_DIR}
                   ${_bench_dir}/sweep)
  # A run that fails (a step_bench stand-in failing at 2 ranks): the error, and the records kept.
  add_test(NAME cli_bench_failing_run
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/bench_failing_run.sh ${ACCEL_CLI} $<TARGET_FILE:step_bench>
                   ${ACCEL_PYTHON} ${PROJECT_SOURCE_DIR} ${_bench_dir}/failing)
  set_tests_properties(cli_bench_sweep_np124 cli_bench_failing_run PROPERTIES ENVIRONMENT "${ACCEL_TEST_ENV}"
                       TIMEOUT 300)
endif()
