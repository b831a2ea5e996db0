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

# examples/llama_finetune under ZeRO-3 at 2 ranks, saved, then opened by Transformers (the README's flow).
if(ACCEL_BUILD_EXAMPLES)
  add_test(NAME examples_llama_finetune_zero3_np2
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/expect.sh pass "loss 4\\.[0-9]+ -> " "saved [0-9]+ safetensors file"
                   "opened, [0-9]+ parameters, loading info clean" --
                   ${CMAKE_CURRENT_SOURCE_DIR}/models/finetune_then_open.sh $<TARGET_FILE:accel_cli> 2
                   ${PROJECT_SOURCE_DIR}/configs/deepspeed/zero3.yaml $<TARGET_FILE:llama_finetune> ${ACCEL_PYTHON}
                   ${PROJECT_SOURCE_DIR} ${CMAKE_BINARY_DIR}/llama_runs/finetune_zero3)
  set_tests_properties(examples_llama_finetune_zero3_np2 PROPERTIES ENVIRONMENT "${ACCEL_LAUNCH_TEST_ENV}" TIMEOUT 600)
endif()

# examples/llama_finetune under every shipped config follows its DDP loss trajectory (fp32), at 2
# ranks and at world 1 with no launcher (tests/examples/follow_reference.sh, as the GPT example).
if(ACCEL_BUILD_EXAMPLES)
  set(_llama_out ${CMAKE_BINARY_DIR}/llama_runs/follow)
  file(MAKE_DIRECTORY ${_llama_out})
  add_test(NAME examples_reference_llama_ddp_np2
           COMMAND ${ACCEL_LAUNCH} launch -n 2 $<TARGET_FILE:llama_finetune> --config_file
                   ${PROJECT_SOURCE_DIR}/configs/ddp.yaml --steps 20 --seed 3 --log_file ${_llama_out}/reference_llama_ddp.log)
  set_tests_properties(examples_reference_llama_ddp_np2 PROPERTIES FIXTURES_SETUP llama_reference
                       ENVIRONMENT "${ACCEL_LAUNCH_TEST_ENV}" TIMEOUT 600)
  foreach(cfg fsdp/full_shard fsdp/shard_grad_op fsdp/no_shard fsdp/hybrid_shard
              deepspeed/zero1 deepspeed/zero2 deepspeed/zero3 deepspeed/zero3_offload ddp)
    string(REPLACE "/" "_" tname ${cfg})
    set(reference ${_llama_out}/reference_llama_ddp.log)
    if(cfg STREQUAL "ddp")
      set(reference world1)
    endif()
    add_test(NAME examples_llama_follows_ddp_${tname}
             COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/examples/follow_reference.sh ${ACCEL_LAUNCH}
                     $<TARGET_FILE:llama_finetune> ${PROJECT_SOURCE_DIR}/configs/${cfg}.yaml ${reference} ${_llama_out})
    set_tests_properties(examples_llama_follows_ddp_${tname} PROPERTIES FIXTURES_REQUIRED llama_reference
                         ENVIRONMENT "${ACCEL_LAUNCH_TEST_ENV}" TIMEOUT 600)
  endforeach()
endif()
