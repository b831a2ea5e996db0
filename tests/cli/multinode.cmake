# Multi-node for real, on one machine: two hosts made of network namespaces joined by a veth pair
# (multinode_netns.sh), `accel launch --hostfile` starting 2 x 2 ranks of the GPT example under
# HYBRID_SHARD with Open MPI over TCP between them (multinode_rsh_agent.sh replaces ssh), then checks
# the cross-node bytes against the figure derived from the model's size, that the ranks ran on two
# hosts, that the veth carried at least those bytes, and that the loss equals the simulated-nodes
# run's (multinode_hybrid_shard.sh). Needs root (CAP_SYS_ADMIN) and iproute2: skipped (exit 77) with
# "SKIP: cannot create network namespaces: <reason>" otherwise. Needs the accel_rank target built
# (accel launch starts each rank through it). About 20 s.
if(ACCEL_BUILD_EXAMPLES)  # it trains the GPT example
  add_test(NAME cli_launch_multinode_netns_hybrid_shard
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/multinode_netns.sh
                   bash ${CMAKE_CURRENT_SOURCE_DIR}/multinode_hybrid_shard.sh
                   ${ACCEL_CLI} $<TARGET_FILE:gpt_lm> ${PROJECT_SOURCE_DIR} ${CMAKE_BINARY_DIR}/multinode_runs
                   ${MPIEXEC_EXECUTABLE})
  set_tests_properties(cli_launch_multinode_netns_hybrid_shard PROPERTIES
                       ENVIRONMENT "${ACCEL_TEST_ENV}" TIMEOUT 600 SKIP_RETURN_CODE 77 LABELS multinode)
endif()

# The scaling report across the same two hosts (tests/cli/bench_multinode.sh): `accel bench --hostfile`
# with DDP and ZeRO-3 at 1, 2 and 4 ranks (the 4-rank runs on 2 hosts x 2 ranks), its records checked
# against closed forms (bytes moved within 1% of the traffic formula) and 2 nodes. About 20 s.
if(ACCEL_BUILD_BENCHMARKS AND ACCEL_PYTHON)  # it runs step_bench and plots with matplotlib
  add_test(NAME cli_bench_multinode_netns
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/multinode_netns.sh
                   bash ${CMAKE_CURRENT_SOURCE_DIR}/bench_multinode.sh
                   ${ACCEL_CLI} ${ACCEL_PYTHON} ${PROJECT_SOURCE_DIR} ${CMAKE_BINARY_DIR}/multinode_bench)
  set_tests_properties(cli_bench_multinode_netns PROPERTIES
                       ENVIRONMENT "${ACCEL_TEST_ENV}" TIMEOUT 600 SKIP_RETURN_CODE 77 LABELS multinode)
endif()

# A job that loses a host goes on with the rest (tests/cli/multinode_shrink.sh): 2 hosts x 2 ranks of
# the GPT example in float64 under ZeRO-3 with `accel launch --max_restarts 1 --min_nodes 1
# --auto_resume`; host 1's ranks are SIGKILLed mid-run; the job must drop host 1, resume from its
# newest checkpoint on host 0's 2 ranks with twice the accumulation, and end with every loss within
# 1e-5 relative of an uninterrupted 4-rank run. About 15 s.
if(ACCEL_BUILD_EXAMPLES)
  add_test(NAME cli_launch_multinode_netns_min_nodes
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/multinode_netns.sh
                   bash ${CMAKE_CURRENT_SOURCE_DIR}/multinode_shrink.sh
                   ${ACCEL_CLI} $<TARGET_FILE:gpt_lm> ${PROJECT_SOURCE_DIR} ${CMAKE_BINARY_DIR}/multinode_shrink)
  set_tests_properties(cli_launch_multinode_netns_min_nodes PROPERTIES
                       ENVIRONMENT "${ACCEL_TEST_ENV}" TIMEOUT 600 SKIP_RETURN_CODE 77 LABELS multinode)
endif()
