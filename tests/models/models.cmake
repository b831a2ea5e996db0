# The Llama model (src/models/) and its Transformers interop. Included from tests/CMakeLists.txt:
# CMAKE_CURRENT_SOURCE_DIR is tests/.
# One binary on every rank of an mpirun, at 1 and 2 ranks: config.json parsing and its errors, the
# KV-cache path, Transformers-saved models loaded here (no config / DDP / ZeRO-3), and a model
# trained here under ZeRO-3 opened in Transformers (tests/models/llama_interop.py, run by rank 0).
# SKIPPABLE: the interop tests skip where ACCEL_PYTHON is not configured (a failure still fails).
accel_test_binary(models_tests models/test_llama.cpp)
target_link_libraries(models_tests PRIVATE accel_test_support nlohmann_json::nlohmann_json)
target_compile_definitions(models_tests PRIVATE ACCEL_SOURCE_DIR="${PROJECT_SOURCE_DIR}" ACCEL_PYTHON="${ACCEL_PYTHON}"
                                                ACCEL_BINARY_DIR="${CMAKE_BINARY_DIR}")
accel_add_mpi_test(NAME models_llama TARGET models_tests NP 1 2 SKIPPABLE)
