# Trackers (src/tracking/, Accelerator::init_trackers/log/end_training): the unit and Accelerator
# tests at 1 and 2 ranks, and the GPT example's files read back by the real tensorboard package.
accel_test_binary(tracking_tests tracking/test_trackers.cpp)
accel_add_mpi_test(NAME tracking TARGET tracking_tests NP 1 2)
if(ACCEL_BUILD_EXAMPLES AND ACCEL_PYTHON)
  foreach(mode yaml flag resume)
    add_test(NAME tracking_gpt_lm_files_${mode}_np2
             COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/tracking/gpt_lm_trackers.sh ${ACCEL_LAUNCH} $<TARGET_FILE:gpt_lm>
                     ${PROJECT_SOURCE_DIR} ${ACCEL_PYTHON} ${CMAKE_BINARY_DIR}/tracking_runs ${mode})
    set_tests_properties(tracking_gpt_lm_files_${mode}_np2 PROPERTIES ENVIRONMENT "${ACCEL_LAUNCH_TEST_ENV}" TIMEOUT 600)
  endforeach()
endif()
# tensorboard.proto's messages against the tensorboard package's own descriptors (field numbers,
# types, labels, oneofs, packing).
if(ACCEL_PYTHON)
  add_test(NAME tracking_proto_fields
           COMMAND sh -c "\"$1\" --descriptor_set_out=\"$4/tensorboard_proto.pb\" -I \"$2\" \"$2/tensorboard.proto\" && \"$3\" \"$5\" \"$4/tensorboard_proto.pb\""
                   sh ${Protobuf_PROTOC_EXECUTABLE} ${PROJECT_SOURCE_DIR}/src/tracking ${ACCEL_PYTHON} ${CMAKE_BINARY_DIR}
                   ${CMAKE_CURRENT_SOURCE_DIR}/tracking/proto_fields.py)
  set_tests_properties(tracking_proto_fields PROPERTIES TIMEOUT 120 PASS_REGULAR_EXPRESSION "equal to the tensorboard package's")
endif()
