# Sanitizer builds: -DACCEL_SANITIZE=thread (ThreadSanitizer) or -DACCEL_SANITIZE=address
# (AddressSanitizer + UndefinedBehaviorSanitizer). scripts/sanitize.sh configures one build directory
# per sanitizer and runs the comm and sharding tests under it (runtime options and suppressions:
# scripts/sanitizers/). The flags apply to every target of this project, so whatever files src/comm
# or src/zero hold, they are instrumented; libtorch and Open MPI stay uninstrumented.
set(ACCEL_SANITIZE "" CACHE STRING "Instrument accel with a sanitizer: thread, address (ASan + UBSan), or empty")
set_property(CACHE ACCEL_SANITIZE PROPERTY STRINGS "" thread address)

if(ACCEL_SANITIZE STREQUAL "")
  return()
elseif(ACCEL_SANITIZE STREQUAL "thread")
  set(_accel_san -fsanitize=thread)
elseif(ACCEL_SANITIZE STREQUAL "address")
  # vptr off: its dynamic-type check goes through the type_info of libtorch's classes (TensorImpl,
  # autograd nodes), built without UBSan and with hidden symbols, where it can report false errors
  # (not tried here; scripts/sanitizers/README.md). Every other UBSan check stays on.
  set(_accel_san -fsanitize=address,undefined -fno-sanitize=vptr)
else()
  message(FATAL_ERROR "ACCEL_SANITIZE=${ACCEL_SANITIZE}: expected thread, address or empty")
endif()

# -O1 -g after the build type's flags (compile options come last on the command line, so -O1 wins
# over Release's -O3): readable stacks, and instrumented code that still runs at a useful speed.
add_compile_options(${_accel_san} -O1 -g -fno-omit-frame-pointer)
add_link_options(${_accel_san})
message(STATUS "accel: sanitizer ${ACCEL_SANITIZE} (${_accel_san})")

# A deliberate bug per sanitizer (scripts/sanitizers/canary.cpp): the script checks that it is reported.
add_executable(accel_sanitizer_canary ${CMAKE_CURRENT_LIST_DIR}/../scripts/sanitizers/canary.cpp)
target_link_libraries(accel_sanitizer_canary PRIVATE Threads::Threads)
