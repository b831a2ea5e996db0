# `accel test`: the conformance worker on every rank under shipped configs, an injected failure
# (FAIL row and non-zero exit), and bad input (a config that does not parse, an unknown key, a
# missing file, an unknown flag or check name: a clear message, non-zero exit, nothing launched).
set(ACCEL_CONFORMANCE_EXPECT ${CMAKE_CURRENT_SOURCE_DIR}/expect.sh)
set(ACCEL_CONFORMANCE_DIR ${CMAKE_BINARY_DIR}/conformance)
file(MAKE_DIRECTORY ${ACCEL_CONFORMANCE_DIR})
set(ACCEL_CONFORMANCE_ALL_PASS "loader_coverage +PASS" "rng_sync +PASS" "training_parity +PASS" "collectives +PASS"
    "trigger +PASS" "gradient_accumulation +PASS")

# accel_conformance_test(NAME pass|fail REGEX... -- COMMAND...)
function(accel_conformance_test name mode)
  add_test(NAME ${name} COMMAND ${ACCEL_CONFORMANCE_EXPECT} ${mode} ${ARGN})
  set_tests_properties(${name} PROPERTIES ENVIRONMENT "${ACCEL_LAUNCH_TEST_ENV}" TIMEOUT 180)
endfunction()

# The worker on every rank (as `accel launch` starts it), one shipped config per strategy family.
foreach(case "ddp;ddp;2" "zero3;deepspeed/zero3;3" "full_shard;fsdp/full_shard;2" "zero2;deepspeed/zero2;2")
  list(GET case 0 tname)
  list(GET case 1 cfg)
  list(GET case 2 np)
  accel_conformance_test(cli_test_worker_${tname}_np${np} pass ${ACCEL_CONFORMANCE_ALL_PASS}
    "6 check\\(s\\) on ${np} process\\(es\\): 6 passed, 0 failed"
    -- ${ACCEL_CLI} launch -n ${np} ${ACCEL_CLI} test --worker --config_file ${PROJECT_SOURCE_DIR}/configs/${cfg}.yaml)
endforeach()
# HSDP: 2 copies of FULL_SHARD over blocks of 2 ranks (parallelism_config).
accel_conformance_test(cli_test_worker_hsdp_np4 pass ${ACCEL_CONFORMANCE_ALL_PASS}
  "FSDP \\(ZERO_3 in shard groups of 2 rank\\(s\\)\\)" "6 check\\(s\\) on 4 process\\(es\\): 6 passed, 0 failed"
  -- ${ACCEL_CLI} launch -n 4 ${ACCEL_CLI} test --worker --config_file ${PROJECT_SOURCE_DIR}/configs/fsdp/hsdp.yaml)
# HYBRID_SHARD over 2 simulated nodes of 2 ranks.
accel_conformance_test(cli_test_worker_hybrid_shard_np4 pass ${ACCEL_CONFORMANCE_ALL_PASS}
  "HYBRID_SHARD" "6 check\\(s\\) on 4 process\\(es\\): 6 passed, 0 failed"
  -- ${ACCEL_CLI} launch -n 4 ${ACCEL_CLI} test --worker --config_file ${PROJECT_SOURCE_DIR}/configs/fsdp/hybrid_shard.yaml)
set_property(TEST cli_test_worker_hybrid_shard_np4 APPEND PROPERTY ENVIRONMENT ACCEL_RANKS_PER_NODE=2)
# Mixed precision: the training checks run in the compute dtype, within that precision's tolerance.
foreach(case "bf16;deepspeed/zero3" "fp16;fsdp/full_shard")
  list(GET case 0 mp)
  list(GET case 1 cfg)
  accel_conformance_test(cli_test_worker_${mp}_np2 pass ${ACCEL_CONFORMANCE_ALL_PASS} "mixed_precision ${mp}"
    "${mp} compute" "6 check\\(s\\) on 2 process\\(es\\): 6 passed, 0 failed"
    -- ${ACCEL_CLI} launch -n 2 ${ACCEL_CLI} test --worker --config_file ${PROJECT_SOURCE_DIR}/configs/${cfg}.yaml)
  set_property(TEST cli_test_worker_${mp}_np2 APPEND PROPERTY ENVIRONMENT ACCEL_MIXED_PRECISION=${mp})
endforeach()
# No launcher, no config: one process with the defaults.
accel_conformance_test(cli_test_worker_defaults_np1 pass ${ACCEL_CONFORMANCE_ALL_PASS}
  "no config file \\(defaults\\)" "6 check\\(s\\) on 1 process\\(es\\): 6 passed, 0 failed"
  -- ${ACCEL_CLI} test --worker)

# A deliberate failure on the last rank reaches the table (FAIL, the rank named) and the exit code,
# and the other checks still run and pass.
accel_conformance_test(cli_test_inject_training_np2 fail "training_parity +FAIL .*failed on rank\\(s\\) 0"
  "loader_coverage +PASS" "gradient_accumulation +PASS" "5 passed, 1 failed: FAILED"
  -- ${ACCEL_CLI} launch -n 2 ${ACCEL_CLI} test --worker --config_file ${PROJECT_SOURCE_DIR}/configs/deepspeed/zero3.yaml
     --inject_failure training_parity)
foreach(check loader_coverage rng_sync collectives trigger gradient_accumulation)
  accel_conformance_test(cli_test_inject_${check}_np2 fail "${check} +FAIL .*failed on rank\\(s\\) (0,)?1"
    "1 check\\(s\\) on 2 process\\(es\\): 0 passed, 1 failed: FAILED"
    -- ${ACCEL_CLI} launch -n 2 ${ACCEL_CLI} test --worker --config_file ${PROJECT_SOURCE_DIR}/configs/fsdp/full_shard.yaml
       --check ${check} --inject_failure ${check})
endforeach()

# Bad input: a clear message, a non-zero exit, and nothing launched.
file(WRITE ${ACCEL_CONFORMANCE_DIR}/broken.yaml "distributed_type: FSDP\nfsdp_config: [unclosed\n")
file(WRITE ${ACCEL_CONFORMANCE_DIR}/unknown_key.yaml "distributed_type: MULTI_CPU\nnum_procesess: 2\n")
accel_conformance_test(cli_test_config_does_not_parse fail "accel test: error: .*broken\\.yaml" "!running"
  -- ${ACCEL_CLI} test --config_file ${ACCEL_CONFORMANCE_DIR}/broken.yaml)
accel_conformance_test(cli_test_config_unknown_key fail "accel test: error: .*unknown_key\\.yaml.*num_procesess.*num_processes"
  "!running" -- ${ACCEL_CLI} test --config_file ${ACCEL_CONFORMANCE_DIR}/unknown_key.yaml)
accel_conformance_test(cli_test_config_missing fail "accel test: error: .*no_such_config\\.yaml" "!running"
  -- ${ACCEL_CLI} test --config_file ${ACCEL_CONFORMANCE_DIR}/no_such_config.yaml)
accel_conformance_test(cli_test_worker_config_does_not_parse_np2 fail "accel test: error: .*broken\\.yaml"
  -- ${ACCEL_CLI} launch -n 2 ${ACCEL_CLI} test --worker --config_file ${ACCEL_CONFORMANCE_DIR}/broken.yaml)
# Started by a launcher directly (the ranks exist): a --num_processes that disagrees is refused, not ignored.
accel_conformance_test(cli_test_under_launcher_num_processes_np2 fail
  "--num_processes 3 but the launcher started 2 rank\\(s\\)" "!check\\(s\\) on"
  -- ${ACCEL_CLI} launch -n 2 ${ACCEL_CLI} test --num_processes 3 --config_file ${PROJECT_SOURCE_DIR}/configs/ddp.yaml)
accel_conformance_test(cli_test_unknown_flag fail "--no_such_flag" -- ${ACCEL_CLI} test --no_such_flag)
accel_conformance_test(cli_test_unknown_check fail "--check.*not in|no_such_check" -- ${ACCEL_CLI} test --check no_such_check)

# The user's path: `accel test` validates the config, then re-runs itself through `accel launch`.
accel_conformance_test(cli_test_launch_ddp pass "running .*/accel launch --config_file .*/configs/ddp\\.yaml .* test .*--worker"
  ${ACCEL_CONFORMANCE_ALL_PASS} "6 check\\(s\\) on 2 process\\(es\\): 6 passed, 0 failed: OK"
  -- ${ACCEL_CLI} test --config_file ${PROJECT_SOURCE_DIR}/configs/ddp.yaml)
accel_conformance_test(cli_test_launch_inject_np3 fail "--num_processes 3" "collectives +FAIL .*failed on rank\\(s\\) (0,1,)?2"
  "1 check\\(s\\) on 3 process\\(es\\): 0 passed, 1 failed: FAILED"
  -- ${ACCEL_CLI} test --config_file ${PROJECT_SOURCE_DIR}/configs/deepspeed/zero3.yaml --num_processes 3
     --check collectives --inject_failure collectives)
# No --config_file: the default config ($ACCEL_HOME/default_config.yaml) when it exists, else none.
file(MAKE_DIRECTORY ${ACCEL_CONFORMANCE_DIR}/home_default ${ACCEL_CONFORMANCE_DIR}/home_empty ${ACCEL_CONFORMANCE_DIR}/home_broken)
configure_file(${PROJECT_SOURCE_DIR}/configs/fsdp/shard_grad_op.yaml ${ACCEL_CONFORMANCE_DIR}/home_default/default_config.yaml COPYONLY)
file(WRITE ${ACCEL_CONFORMANCE_DIR}/home_broken/default_config.yaml "distributed_type: [FSDP\n")
accel_conformance_test(cli_test_launch_default_config pass "home_default/default_config\\.yaml: FSDP"
  "trigger +PASS" "collectives +PASS" "2 check\\(s\\) on 2 process\\(es\\): 2 passed"
  -- ${ACCEL_CLI} test --check trigger --check collectives)
accel_conformance_test(cli_test_launch_no_config pass "no config file \\(defaults\\)" "trigger +PASS"
  "1 check\\(s\\) on 1 process\\(es\\): 1 passed"
  -- ${ACCEL_CLI} test --check trigger)
accel_conformance_test(cli_test_default_config_does_not_parse fail "accel test: error: .*home_broken/default_config\\.yaml"
  "!running" -- ${ACCEL_CLI} test)
set_property(TEST cli_test_launch_default_config APPEND PROPERTY ENVIRONMENT ACCEL_HOME=${ACCEL_CONFORMANCE_DIR}/home_default)
set_property(TEST cli_test_launch_no_config APPEND PROPERTY ENVIRONMENT ACCEL_HOME=${ACCEL_CONFORMANCE_DIR}/home_empty)
set_property(TEST cli_test_default_config_does_not_parse APPEND PROPERTY ENVIRONMENT
             ACCEL_HOME=${ACCEL_CONFORMANCE_DIR}/home_broken)
