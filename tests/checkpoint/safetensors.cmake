# The safetensors reader/writer (src/checkpoint/safetensors.*), save_model / load_model
# (src/checkpoint/model_export.*).

# Single process: round trips, the Python `safetensors` package both ways, corrupted files, mutations.
accel_unit_binary(safetensors_tests test_safetensors.cpp)
target_link_libraries(safetensors_tests PRIVATE accel_test_support nlohmann_json::nlohmann_json)
target_compile_definitions(safetensors_tests PRIVATE ACCEL_SOURCE_DIR="${PROJECT_SOURCE_DIR}" ACCEL_PYTHON="${ACCEL_PYTHON}")

set(ACCEL_ST_TESTS
  units "SafetensorsRoundTrip.*:SafetensorsWriter.*:SafetensorsDtypes.*"
  python "SafetensorsPython.*"
  corrupt "SafetensorsCorrupt.*"
  mutations "SafetensorsFuzz.*")
while(ACCEL_ST_TESTS)
  list(POP_FRONT ACCEL_ST_TESTS tname tfilter)
  # SKIPPABLE: the Python tests skip where the `safetensors` package is missing (a failure still fails).
  accel_add_gtest(NAME checkpoint_safetensors_${tname} TARGET safetensors_tests FILTER ${tfilter} TIMEOUT 300 SKIPPABLE)
endwhile()

# libFuzzer on the header parser, where clang++ with -fsanitize=fuzzer exists (run_fuzz.sh exits 77,
# skipped, otherwise). A short smoke run; run_fuzz.sh with a longer time is the real campaign.
find_program(ACCEL_CLANGXX NAMES clang++ clang++-16 clang++-15 clang++-14)
if(ACCEL_CLANGXX)
  add_test(NAME checkpoint_safetensors_libfuzzer_smoke
           COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/run_fuzz.sh 10 ${CMAKE_BINARY_DIR}/fuzz_safetensors)
  set_tests_properties(checkpoint_safetensors_libfuzzer_smoke PROPERTIES TIMEOUT 300 SKIP_RETURN_CODE 77
                       ENVIRONMENT "CXX=${ACCEL_CLANGXX}")
endif()

# Multi-rank: save_model / load_model under every strategy (one binary on every rank of an mpirun).
accel_test_binary(model_export_tests test_model_export.cpp)
target_link_libraries(model_export_tests PRIVATE accel_test_support nlohmann_json::nlohmann_json)
target_compile_definitions(model_export_tests PRIVATE ACCEL_SOURCE_DIR="${PROJECT_SOURCE_DIR}" ACCEL_PYTHON="${ACCEL_PYTHON}")
accel_add_mpi_test(NAME checkpoint_save_model TARGET model_export_tests NP 1 2 3 4 SKIPPABLE)
accel_add_mpi_test(NAME checkpoint_save_model_private TARGET model_export_tests NP 2 3 4 SKIPPABLE
                   FILTER -SaveModel.GatheredMemoryStaysWithinOneUnit ENV ${ACCEL_PRIVATE_SHARDS})
# merge_weights over checkpoints of two simulated nodes (HYBRID_SHARD with two replicas: each shard
# written once, by the first replica).
accel_add_mpi_test(NAME checkpoint_merge_2nodes TARGET model_export_tests NP 4 FILTER MergeWeights.*
                   ENV ACCEL_RANKS_PER_NODE=2)
