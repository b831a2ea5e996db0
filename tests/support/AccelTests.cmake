# How accel's GoogleTest binaries are built and become ctest tests. include()d from tests/CMakeLists.txt;
# the functions read ACCEL_TEST_ENV and ACCEL_TESTS_DIR (set there) at the call.
#
#   accel_add_mpi_test(NAME <prefix> TARGET <exe> NP <n>... [SUFFIX <s>] [FILTER <gtest filter>]
#                      [ARGS <arg>...] [ENV <VAR=value>...] [TIMEOUT <s>] [LABELS <label>...] [SKIPPABLE])
#     One test per world size N, named <prefix>_np<N><suffix>: the binary on every rank of
#     `accel launch -n N`, so tests start the way users' programs do (mpirun --oversubscribe, each rank
#     on its share of the cores, unbound when N exceeds them; OMP_NUM_THREADS from ACCEL_TEST_ENV is
#     kept). ACCEL_HOME points into the build tree, so a user's default config never reaches a test.
#     tests/test_main.cpp makes every rank exit with the worst result; accel launch exits with it.
#
#   accel_add_gtest(NAME <name> TARGET <exe> [FILTER ...] [ARGS ...] [ENV ...] [TIMEOUT <s>] [LABELS ...]
#                   [SKIPPABLE])
#     The binary as one plain process.
#
#   accel_test_binary(<target> <source>...)
#     A multi-rank GoogleTest binary: tests/test_main.cpp (every rank reports, the worst result wins)
#     plus the sources.
#   accel_unit_binary(<target> <source>...)
#     A one-process GoogleTest binary (GoogleTest's own main).
#   Both link the library and GoogleTest, with tests/ and examples/ on the include path, and are
#   compiled by accel_test_compile.
#
#   accel_test_compile(<target>)
#     How test code is compiled (it is a third of a clean build): at ACCEL_TEST_OPTIMIZE (-O1 in an
#     optimized build; a test's time goes to the library and libtorch, not to its own code), with the
#     precompiled headers of accel_test_pch (libtorch's ATen, nn and optim headers, GoogleTest), and as
#     a unity build where ACCEL_UNITY_BUILD is on: ACCEL_TEST_UNITY_BATCH sources per translation unit,
#     so that the templates they share are instantiated and compiled once per batch, not once per file.
#     (Each test file keeps its helpers in a namespace of its own, so that files can share a batch.)
#
#   accel_follow_ddp_tests(<name> <example target> <out dir>)
#     The example under every shipped config follows its DDP loss trajectory (fp32), at 2 ranks and
#     at world 1 with no launcher (tests/examples/follow_reference.sh): examples_reference_<name>_ddp_np2
#     writes the reference (the example under configs/ddp.yaml at 2 ranks), then one
#     examples_<name>_follows_ddp_<config> per config (ddp itself: its 2-rank run against its world-1 run).
#
# Every test gets ENVIRONMENT ${ACCEL_TEST_ENV} plus ENV, and TIMEOUT (default 600 s).
# SKIPPABLE: the binary may GTEST_SKIP (a missing GPU, a missing Python package). It runs under
# tests/support/gtest_skips.sh, which reports "skipped" (exit 77, SKIP_RETURN_CODE) only when the run
# succeeded and skipped at least one test; a failure anywhere in the run is a failure. (ctest's
# SKIP_REGULAR_EXPRESSION would win over the exit status and show a run where one test skipped and
# another failed as skipped.)
set(ACCEL_GTEST_SKIPS ${CMAKE_CURRENT_LIST_DIR}/gtest_skips.sh)

function(_accel_gtest_register name)  # uses the caller's parsed T_* variables and CMD
  set(cmd ${CMD})
  if(T_SKIPPABLE)
    set(cmd bash ${ACCEL_GTEST_SKIPS} ${cmd})
  endif()
  add_test(NAME ${name} COMMAND ${cmd})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 600)
  endif()
  set(env ${ACCEL_TEST_ENV} ${T_ENV})
  set_tests_properties(${name} PROPERTIES ENVIRONMENT "${env}" TIMEOUT ${T_TIMEOUT})
  if(T_SKIPPABLE)
    set_tests_properties(${name} PROPERTIES SKIP_RETURN_CODE 77)
  endif()
  if(T_LABELS)
    set_tests_properties(${name} PROPERTIES LABELS "${T_LABELS}")
  endif()
endfunction()

macro(_accel_gtest_parse)
  cmake_parse_arguments(T "SKIPPABLE" "NAME;TARGET;SUFFIX;FILTER;TIMEOUT" "NP;ARGS;ENV;LABELS" ${ARGN})
  if(NOT T_NAME OR NOT T_TARGET)
    message(FATAL_ERROR "accel test helper: NAME and TARGET are required")
  endif()
  if(T_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "accel test helper (${T_NAME}): unknown arguments ${T_UNPARSED_ARGUMENTS}")
  endif()
  set(_gtest_args ${T_ARGS})
  if(DEFINED T_FILTER)
    list(PREPEND _gtest_args --gtest_filter=${T_FILTER})
  endif()
endmacro()

function(accel_add_mpi_test)
  _accel_gtest_parse(${ARGN})
  if(NOT T_NP)
    message(FATAL_ERROR "accel_add_mpi_test(${T_NAME}): NP <world sizes> is required")
  endif()
  add_dependencies(${T_TARGET} accel_cli accel_rank)  # the launcher the test runs under
  list(APPEND T_ENV ACCEL_HOME=${CMAKE_BINARY_DIR}/tests_accel_home)
  foreach(np IN LISTS T_NP)
    set(CMD $<TARGET_FILE:accel_cli> launch -n ${np} $<TARGET_FILE:${T_TARGET}> ${_gtest_args})
    _accel_gtest_register(${T_NAME}_np${np}${T_SUFFIX})
  endforeach()
endfunction()

function(accel_add_gtest)
  _accel_gtest_parse(${ARGN})
  if(T_NP OR T_SUFFIX)
    message(FATAL_ERROR "accel_add_gtest(${T_NAME}): one process; use accel_add_mpi_test for NP")
  endif()
  set(CMD $<TARGET_FILE:${T_TARGET}> ${_gtest_args})
  _accel_gtest_register(${T_NAME})
endfunction()

function(accel_test_compile target)
  target_compile_options(${target} PRIVATE ${ACCEL_TEST_OPTIMIZE})
  target_precompile_headers(${target} REUSE_FROM accel_test_pch)
  set_target_properties(${target} PROPERTIES UNITY_BUILD ${ACCEL_UNITY_BUILD}
                                             UNITY_BUILD_BATCH_SIZE ${ACCEL_TEST_UNITY_BATCH})
  set_property(GLOBAL APPEND PROPERTY ACCEL_UNITY_TARGETS ${target})  # checked by build_unity_names
endfunction()

function(accel_test_binary target)
  add_executable(${target} ${ACCEL_TESTS_DIR}/test_main.cpp ${ARGN})
  target_include_directories(${target} PRIVATE ${ACCEL_TESTS_DIR} ${PROJECT_SOURCE_DIR}/examples)
  target_link_libraries(${target} PRIVATE accel GTest::gtest)
  accel_test_compile(${target})
endfunction()

function(accel_unit_binary target)
  add_executable(${target} ${ARGN})
  target_include_directories(${target} PRIVATE ${ACCEL_TESTS_DIR} ${PROJECT_SOURCE_DIR}/examples)
  target_link_libraries(${target} PRIVATE accel GTest::gtest GTest::gtest_main)
  accel_test_compile(${target})
endfunction()

function(accel_follow_ddp_tests name example out)
  file(MAKE_DIRECTORY ${out})
  add_test(NAME examples_reference_${name}_ddp_np2
           COMMAND ${ACCEL_LAUNCH} launch -n 2 $<TARGET_FILE:${example}> --config_file ${PROJECT_SOURCE_DIR}/configs/ddp.yaml
                   --steps 20 --seed 3 --log_file ${out}/reference_${name}_ddp.log)
  set_tests_properties(examples_reference_${name}_ddp_np2 PROPERTIES FIXTURES_SETUP ${name}_reference
                       ENVIRONMENT "${ACCEL_LAUNCH_TEST_ENV}" TIMEOUT 600)
  foreach(cfg fsdp/full_shard fsdp/shard_grad_op fsdp/no_shard fsdp/hybrid_shard
              deepspeed/zero1 deepspeed/zero2 deepspeed/zero3 deepspeed/zero3_offload ddp)
    string(REPLACE "/" "_" tname ${cfg})
    set(reference ${out}/reference_${name}_ddp.log)
    if(cfg STREQUAL "ddp")
      set(reference world1)
    endif()
    add_test(NAME examples_${name}_follows_ddp_${tname}
             COMMAND ${ACCEL_TESTS_DIR}/examples/follow_reference.sh ${ACCEL_LAUNCH} $<TARGET_FILE:${example}>
                     ${PROJECT_SOURCE_DIR}/configs/${cfg}.yaml ${reference} ${out})
    set_tests_properties(examples_${name}_follows_ddp_${tname} PROPERTIES FIXTURES_REQUIRED ${name}_reference
                         ENVIRONMENT "${ACCEL_LAUNCH_TEST_ENV}" TIMEOUT 600)
  endforeach()
endfunction()
