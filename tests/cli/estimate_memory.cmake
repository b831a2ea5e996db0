# `accel estimate-memory`: unit tests of the arithmetic (in cli_tests) and runs of the real binary.
target_sources(cli_tests PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/test_estimate_memory.cpp)

# Each run checks its exit status and its output (tests/cli/expect.sh).
set(_em_expect bash ${CMAKE_CURRENT_SOURCE_DIR}/expect.sh)

# The ZeRO paper's example: 7.5B parameters on 64 ranks -> 120, 31.4, 16.6 and 1.9 GB.
add_test(NAME cli_estimate_memory_paper
         COMMAND ${_em_expect} pass "DDP \\(NO_SHARD\\) +120\\.0 " "ZeRO-1 +31\\.4 " "ZeRO-2 \\(SHARD_GRAD_OP\\) +16\\.6 "
                 "ZeRO-3 \\(FULL_SHARD\\) +1\\.9 " -- ${ACCEL_CLI} estimate-memory --params 7.5e9 --num_processes 64)

# A 24 GB budget: ZeRO-2 is the least-sharded strategy that fits.
add_test(NAME cli_estimate_memory_budget
         COMMAND ${_em_expect} pass "ZeRO-1 +31\\.4 .*no, at any N" "ZeRO-2 \\(SHARD_GRAD_OP\\) +16\\.6 .*yes, 7\\.4 GB spare"
                 "Recommendation: ZeRO-2" -- ${ACCEL_CLI} estimate-memory --params 7.5B --num_processes 64 --budget 24GB)

# Optimizer offload: ZeRO-2 keeps its 2-byte parameters (15.0 GB), the CPU 16P/N (1.9 GB).
add_test(NAME cli_estimate_memory_offload
         COMMAND ${_em_expect} pass "ZeRO-2 \\(SHARD_GRAD_OP\\) +15\\.0 +1\\.9 +2P +16P/N"
                 -- ${ACCEL_CLI} estimate-memory --params 7.5e9 --num_processes 64 --offload optimizer --dtype fp16 --optimizer adam)

# The budget example with 4 micro-steps a step. Not reducing (NoSync), every rank also holds the
# window's whole sum in fp32: ZeRO-2 6P + 14P/N = 46.6 GB, ZeRO-3 4P + 16P/N = 31.9 GB, both over 24 GB,
# and no offload moves that sum: nothing fits, and the recommendation names what does with each
# micro-step reducing. Reducing (--sync_each_batch), ZeRO-2 adds each reduced shard to the sum as its
# bucket finishes and holds what it does without accumulation, 2P + 14P/N = 16.6 GB: recommended.
add_test(NAME cli_estimate_memory_accumulation
         COMMAND ${_em_expect} pass "accumulate 4 micro-steps a step, not reducing" "ZeRO-2 \\(SHARD_GRAD_OP\\) \\* +46\\.6 .*no"
                 "ZeRO-3 \\(FULL_SHARD\\) \\* +31\\.9 .*no" "Recommendation: none"
                 "With each micro-step reducing \\(--sync_each_batch\\), ZeRO-2 \\(SHARD_GRAD_OP\\) fits: 16\\.6 GB"
                 -- ${ACCEL_CLI} estimate-memory --params 7.5B --num_processes 64 --budget 24GB --gradient_accumulation_steps 4)
add_test(NAME cli_estimate_memory_accumulation_sync_each_batch
         COMMAND ${_em_expect} pass "ZeRO-2 \\(SHARD_GRAD_OP\\) \\* +16\\.6 .*yes" "Recommendation: ZeRO-2"
                 -- ${ACCEL_CLI} estimate-memory --params 7.5B --num_processes 64 --budget 24GB --gradient_accumulation_steps 4
                    --sync_each_batch)

# The same window summed in bf16 (--grad_accum_dtype): ZeRO-3 holds 2P + 16P/N = 16.9 GB and fits.
add_test(NAME cli_estimate_memory_accumulation_bf16_sum
         COMMAND ${_em_expect} pass "summed in bf16 \\(--grad_accum_dtype\\)" "ZeRO-3 \\(FULL_SHARD\\) \\* +16\\.9 .*yes"
                 "Recommendation: ZeRO-3"
                 -- ${ACCEL_CLI} estimate-memory --params 7.5B --num_processes 64 --budget 24GB --gradient_accumulation_steps 4
                    --grad_accum_dtype bf16)
add_test(NAME cli_estimate_memory_accumulation_bad_sum
         COMMAND ${_em_expect} fail "--grad_accum_dtype: fp16 cannot hold bf16 gradients"
                 -- ${ACCEL_CLI} estimate-memory --params 7.5B --gradient_accumulation_steps 4 --grad_accum_dtype fp16)

# Copies of shard groups (HSDP, MiCS): 64 ranks in groups of 8 store per rank what 8 ranks store.
# In 40 GB, ZeRO-1 over 8 (4P + 12P/8 = 41.2 GB) does not fit where over 64 (31.4 GB) it would:
# ZeRO-2 over 8 (28.1 GB) is recommended; ZeRO-3 16P/8 = 15.0 GB.
add_test(NAME cli_estimate_memory_shard_groups
         COMMAND ${_em_expect} pass "64 ranks in shard groups of 8 \\(8 copies" "ZeRO-1 +41\\.2 .*no"
                 "ZeRO-2 \\(SHARD_GRAD_OP\\) +28\\.1 .*yes" "ZeRO-3 \\(FULL_SHARD\\) +15\\.0 " "Recommendation: ZeRO-2"
                 "no, fits in shard groups of 16"
                 -- ${ACCEL_CLI} estimate-memory --params 7.5B --num_processes 64 --shard_group_size 8 --budget 40GB)

# An empty group size as its own argument is refused, not taken as every rank.
add_test(NAME cli_estimate_memory_bad_shard_groups_empty_argument
         COMMAND ${_em_expect} fail "error: --shard_group_size: not a whole number: ''"
                 -- ${ACCEL_CLI} estimate-memory --params 1B --num_processes 8 --shard_group_size "")

# A GPT shape: 1.02B parameters, the whole per-rank peak with activations, ZeRO-3 fits 11 GB at 2 ranks.
add_test(NAME cli_estimate_memory_gpt
         COMMAND ${_em_expect} pass "1\\.02B parameters \\(1015566336\\)" "ZeRO-3 \\+ checkpointing .* 9\\.7  yes"
                 "DDP +16\\.2 .* no" "Recommendation: ZeRO-3, 9\\.8 GB"
                 -- ${ACCEL_CLI} estimate-memory --d_model 2048 --layers 20 --heads 16 --seq 64 --num_processes 2 --dtype fp32 --budget 11GB)

# A GPT shape under offload, as the GPU's largest-model table runs it (one rank, 8 GB, the allocator's peak:
# --overhead 0): ZeRO-Infinity at 2.47B needs 5.5 GB of the device (3.7 GB checkpointed) and 39.6 GB of
# host memory; it trained there on an H200 (benchmarks/results/2026-11-27-h200-check.md).
add_test(NAME cli_estimate_memory_gpt_offload
         COMMAND ${_em_expect} pass "2\\.47B parameters" "ZeRO-3 \\+ checkpointing +0\\.059 .* 3\\.7 +39\\.6  yes"
                 "No DDP row" "Recommendation: ZeRO-3 with the optimizer and parameters offloaded"
                 -- ${ACCEL_CLI} estimate-memory --d_model 3200 --layers 20 --heads 16 --seq 512 --attention sdpa --dtype fp32
                    --offload optimizer+params --overhead 0 --budget 8GB)

# Bad input: a clear message and a non-zero exit.
set(_em_cases
  "unknown_flag|--foo|${ACCEL_CLI} estimate-memory --params 7.5e9 --foo 3"
  "missing_params|error: give --params or a GPT shape|${ACCEL_CLI} estimate-memory --num_processes 8"
  "params_abc|error: --params: not a number: 'abc'|${ACCEL_CLI} estimate-memory --params abc"
  "params_negative|error: --params: must be positive|${ACCEL_CLI} estimate-memory --params=-5"
  "params_suffix|error: --params: unknown suffix|${ACCEL_CLI} estimate-memory --params 7.5X"
  "num_processes_zero|error: --num_processes: must be at least 1|${ACCEL_CLI} estimate-memory --params 7.5e9 --num_processes 0"
  "num_processes_abc|error: --num_processes: not a whole number|${ACCEL_CLI} estimate-memory --params 7.5e9 --num_processes abc"
  "dtype|error: --dtype: unknown precision 'fp64'|${ACCEL_CLI} estimate-memory --params 7.5e9 --dtype fp64"
  "optimizer|error: --optimizer: unknown optimizer 'lion'|${ACCEL_CLI} estimate-memory --params 7.5e9 --optimizer lion"
  "offload|error: --offload: unknown offload 'nvme'|${ACCEL_CLI} estimate-memory --params 7.5e9 --offload nvme"
  "budget|error: --budget: unknown unit|${ACCEL_CLI} estimate-memory --params 7.5e9 --budget 24XB"
  "overhead|error: --overhead: must be 0 or more|${ACCEL_CLI} estimate-memory --d_model 64 --layers 2 --heads 2 --seq 8 --overhead=-1GB"
  "shard_groups|error: --shard_group_size 3 does not divide --num_processes 8|${ACCEL_CLI} estimate-memory --params 1B --num_processes 8 --shard_group_size 3"
  "shard_groups_empty|--shard_group_size: 1 required TEXT missing|${ACCEL_CLI} estimate-memory --params 1B --num_processes 8 --shard_group_size="
  "accumulation_zero|error: --gradient_accumulation_steps: must be at least 1|${ACCEL_CLI} estimate-memory --params 7.5e9 --gradient_accumulation_steps 0"
  "gpt_and_params|error: give either --params or a GPT shape|${ACCEL_CLI} estimate-memory --params 1B --d_model 64 --layers 2 --heads 2 --seq 8"
  "gpt_partial|error: a GPT shape needs --d_model, --layers, --heads and --seq|${ACCEL_CLI} estimate-memory --d_model 64 --layers 2"
  "gpt_heads|error: --heads: 3 does not divide --d_model 64|${ACCEL_CLI} estimate-memory --d_model 64 --layers 2 --heads 3 --seq 8"
  "overhead_with_params|error: --overhead goes with a GPT shape|${ACCEL_CLI} estimate-memory --params 1B --overhead 9GB")
foreach(_case IN LISTS _em_cases)
  string(REPLACE "|" ";" _parts "${_case}")
  list(GET _parts 0 _name)
  list(GET _parts 1 _regex)
  list(GET _parts 2 _cmd)
  separate_arguments(_cmd UNIX_COMMAND "${_cmd}")
  add_test(NAME cli_estimate_memory_bad_${_name} COMMAND ${_em_expect} fail "${_regex}" -- ${_cmd})
endforeach()

get_property(_em_tests DIRECTORY PROPERTY TESTS)
list(FILTER _em_tests INCLUDE REGEX "^cli_estimate_memory_")
set_tests_properties(${_em_tests} PROPERTIES ENVIRONMENT "${ACCEL_TEST_ENV}" TIMEOUT 60)
