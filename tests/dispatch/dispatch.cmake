# Big-model inference (src/dispatch/): init_empty_weights, infer_auto_device_map,
# load_checkpoint_and_dispatch. Included from tests/CMakeLists.txt: CMAKE_CURRENT_SOURCE_DIR is tests/.
accel_test_binary(dispatch_tests dispatch/test_dispatch.cpp dispatch/test_dispatch_rss.cpp dispatch/test_generate.cpp)
target_link_libraries(dispatch_tests PRIVATE nlohmann_json::nlohmann_json)
accel_add_mpi_test(NAME dispatch TARGET dispatch_tests NP 1 FILTER -*CUDA*:DispatchRss*)
# Units on a GPU, the cpu and disk around a main device; skipped without a device.
set(_accel_cpu_env ${ACCEL_TEST_ENV})
list(REMOVE_ITEM ACCEL_TEST_ENV ACCEL_USE_CPU=1)
accel_add_mpi_test(NAME dispatch SUFFIX _CUDA TARGET dispatch_tests NP 1 FILTER *CUDA* SKIPPABLE)
set(ACCEL_TEST_ENV ${_accel_cpu_env})
# Peak RSS with units on disk: the checkpoint is written by one process and measured in another.
set(_accel_rss_env ACCEL_DISPATCH_RSS_DIR=${CMAKE_BINARY_DIR}/dispatch_rss)
accel_add_gtest(NAME dispatch_rss_write TARGET dispatch_tests FILTER DispatchRss.Write* ENV ${_accel_rss_env})
accel_add_gtest(NAME dispatch_rss_peak TARGET dispatch_tests FILTER DispatchRss.PeakStaysUnderTheBudgetPlusOneUnit
                ENV ${_accel_rss_env})
accel_add_gtest(NAME dispatch_rss_llama_generation TARGET dispatch_tests
                FILTER DispatchRss.LlamaGenerationPeakStaysUnderTheBudgetPlusOneLayer ENV ${_accel_rss_env})
set_tests_properties(dispatch_rss_write PROPERTIES FIXTURES_SETUP dispatch_rss)
set_tests_properties(dispatch_rss_peak dispatch_rss_llama_generation PROPERTIES FIXTURES_REQUIRED dispatch_rss)

# examples/generate: fully loaded and paged from disk give the same tokens.
if(ACCEL_BUILD_EXAMPLES)
  add_test(NAME dispatch_generate_example
           COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/dispatch/generate_matches.sh $<TARGET_FILE:generate>
                   ${CMAKE_BINARY_DIR}/dispatch_generate)
  set_tests_properties(dispatch_generate_example PROPERTIES ENVIRONMENT "${ACCEL_TEST_ENV}" TIMEOUT 300)
endif()
