# Tests beyond the unit binary: PyTorch reference parity, the CLI's bad-input behaviour, and a
# short end-to-end training run. Included from CMakeLists.txt.

# ---- PyTorch reference, regenerated on every ctest run ---------------------------------------
set(ZT_REF_DIR ${CMAKE_BINARY_DIR}/ref)
foreach(cfg tiny odd wide)
  add_test(NAME pytorch_reference_${cfg}
           COMMAND ${ZT_PYTHON} ${CMAKE_SOURCE_DIR}/test/ref/gen_reference.py --config ${cfg} --out ${ZT_REF_DIR}/${cfg})
  set_tests_properties(pytorch_reference_${cfg} PROPERTIES FIXTURES_SETUP pytorch_reference
                       ENVIRONMENT "OMP_NUM_THREADS=2;PYTHONDONTWRITEBYTECODE=1")
endforeach()

file(GLOB ZT_PARITY_TESTS CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/test/parity/*.cpp)
add_executable(zt_parity_tests ${ZT_PARITY_TESTS})
target_link_libraries(zt_parity_tests PRIVATE zt GTest::gtest GTest::gtest_main)
target_compile_definitions(zt_parity_tests PRIVATE ZT_REF_DIR="${ZT_REF_DIR}")
gtest_discover_tests(zt_parity_tests DISCOVERY_TIMEOUT 60
                     PROPERTIES FIXTURES_REQUIRED pytorch_reference ENVIRONMENT "OMP_NUM_THREADS=2")

# ---- the binary on bad input and on a short real run -----------------------------------------
add_test(NAME cli_bad_input COMMAND bash ${CMAKE_SOURCE_DIR}/test/cli/bad_input.sh $<TARGET_FILE:train>
         WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
add_test(NAME cli_train_sample COMMAND bash ${CMAKE_SOURCE_DIR}/test/cli/train_sample.sh $<TARGET_FILE:train>
         WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
set_tests_properties(cli_bad_input cli_train_sample PROPERTIES ENVIRONMENT "OMP_NUM_THREADS=2")
