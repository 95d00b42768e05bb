# The emulation build (test/emu/README.md): the CUDA backend's sources compiled by g++ against an
# emulated CUDA runtime, cuBLASLt and CUB, so that the GPU tests and a short `--set device=cuda`
# run execute on machines without a GPU. Test-only: zt_emu is linked by zt_gpu_tests_emu and
# zt_train_emu, never by ./train. Included from test/tests.cmake when the CUDA backend is built.
set(ZT_EMU_DIR ${CMAKE_SOURCE_DIR}/test/emu)
set(ZT_EMU_GEN ${CMAKE_BINARY_DIR}/emu_src)
set(ZT_EMU_SOURCES)
foreach(cu ${ZT_CUDA_SOURCES})
  file(RELATIVE_PATH rel ${CMAKE_SOURCE_DIR}/src ${cu})
  set(out ${ZT_EMU_GEN}/${rel}.cpp)
  add_custom_command(OUTPUT ${out}
                     COMMAND ${CMAKE_COMMAND} -DIN=${cu} -DOUT=${out} -P ${ZT_EMU_DIR}/rewrite.cmake
                     DEPENDS ${cu} ${ZT_EMU_DIR}/rewrite.cmake
                     COMMENT "emu: ${rel} -> C++")
  list(APPEND ZT_EMU_SOURCES ${out})
endforeach()
set_source_files_properties(${ZT_EMU_SOURCES} PROPERTIES COMPILE_OPTIONS "-include;${ZT_EMU_DIR}/cuda_emu.h")
# AdamW as nvcc builds it (-fmad=false, CMakeLists.txt): no contraction into FMAs.
set_source_files_properties(${ZT_EMU_GEN}/kernels/adamw.cu.cpp PROPERTIES COMPILE_OPTIONS
                            "-include;${ZT_EMU_DIR}/cuda_emu.h;-ffp-contract=off")

add_library(zt_emu STATIC ${ZT_EMU_SOURCES} ${ZT_EMU_DIR}/runtime.cpp ${ZT_EMU_DIR}/cublaslt.cpp
                   ${ZT_EMU_DIR}/nccl.cpp)
target_link_libraries(zt_emu PUBLIC zt_core)
# The shadow headers (cub/...) come before the toolkit's.
target_include_directories(zt_emu BEFORE PRIVATE ${ZT_EMU_DIR}/include ${ZT_EMU_DIR})
target_compile_options(zt_emu PRIVATE -Wall -Wno-unknown-pragmas -Wno-unused-parameter -Wno-unused-function
                                      -fno-math-errno -fno-strict-aliasing)

add_executable(zt_gpu_tests_emu ${ZT_GPU_TESTS})
target_link_libraries(zt_gpu_tests_emu PRIVATE zt_emu GTest::gtest GTest::gtest_main)
gtest_discover_tests(zt_gpu_tests_emu TEST_PREFIX "emulated." DISCOVERY_TIMEOUT 60
                     PROPERTIES LABELS emu TIMEOUT 300
                                ENVIRONMENT "OMP_NUM_THREADS=2;OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1")

add_executable(zt_train_emu ${CMAKE_SOURCE_DIR}/train.cu)
target_link_libraries(zt_train_emu PRIVATE zt_emu CLI11::CLI11)
target_compile_definitions(zt_train_emu PRIVATE ZT_VERSION="${PROJECT_VERSION}-${ZT_GIT}-emu")

add_test(NAME emulated.train_device_cuda
         COMMAND bash ${ZT_EMU_DIR}/train_emu.sh $<TARGET_FILE:train> $<TARGET_FILE:zt_train_emu>
         WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
set_tests_properties(emulated.train_device_cuda PROPERTIES LABELS emu TIMEOUT 300 ENVIRONMENT "OMP_NUM_THREADS=2")
# Checkpoints through device memory and bf16 parameters (test/emu/checkpoint_emu.sh, ~20 s): resume
# bit for bit, and CPU <-> bf16 continuing each other's checkpoints.
add_test(NAME emulated.checkpoint
         COMMAND bash ${ZT_EMU_DIR}/checkpoint_emu.sh $<TARGET_FILE:train> $<TARGET_FILE:zt_train_emu>
         WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
set_tests_properties(emulated.checkpoint PROPERTIES LABELS emu TIMEOUT 300 ENVIRONMENT "OMP_NUM_THREADS=2")

# The emulator's own checks: each bug class it promises to catch is caught (death tests), the
# correct code passes; the NCCL comm (one emulated rank) ordered against the compute stream.
add_executable(zt_emu_checks ${ZT_EMU_DIR}/checks_emu_test.cpp)
target_compile_options(zt_emu_checks PRIVATE -include ${ZT_EMU_DIR}/cuda_emu.h)
target_include_directories(zt_emu_checks BEFORE PRIVATE ${ZT_EMU_DIR})
target_link_libraries(zt_emu_checks PRIVATE zt_emu GTest::gtest GTest::gtest_main)
gtest_discover_tests(zt_emu_checks TEST_PREFIX "emulated." DISCOVERY_TIMEOUT 60
                     PROPERTIES LABELS emu TIMEOUT 120
                                ENVIRONMENT "OMP_NUM_THREADS=2;OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1")
