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

# The real binary's training loop (gradient accumulation over micro-steps and ranks, schedule,
# clipping) against PyTorch: the reference model and tokens go in as llm.c files, the metrics JSONL
# comes out. One run is under mpirun (2 ranks); a few seconds in all.
add_test(NAME train_parity
         COMMAND ${ZT_PYTHON} ${CMAKE_SOURCE_DIR}/test/ref/train_parity.py --train $<TARGET_FILE:train>
                 --mpirun ${MPIEXEC_EXECUTABLE})
set_tests_properties(train_parity PROPERTIES TIMEOUT 300 ENVIRONMENT
                     "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMP_NUM_THREADS=1;PYTHONDONTWRITEBYTECODE=1")

# ---- the binary on bad input and on a short real run -----------------------------------------
add_test(NAME cli_bad_input COMMAND bash ${CMAKE_SOURCE_DIR}/test/cli/bad_input.sh $<TARGET_FILE:train> ${ZT_HAVE_CUDA}
         WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
add_test(NAME cli_train_sample COMMAND bash ${CMAKE_SOURCE_DIR}/test/cli/train_sample.sh $<TARGET_FILE:train>
         WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
set_tests_properties(cli_bad_input cli_train_sample PROPERTIES ENVIRONMENT "OMP_NUM_THREADS=2")

# ---- multi-rank: the ZeRO acceptance matrix and a hung collective in a real run ----------------
# zero_matrix: N in {1,2,3,4} x stage 0-3 x overlap on/off x grad_accum {1,3} against single-rank
# stage 0 (loss, final weights, bytes per step vs theory, tracked memory vs `train estimate`);
# about 2-3 minutes on 2 cores. hang_train: a skipped collective at step 2 must end the job with the
# timeout diagnostic within comm.timeout_s + 10 s, for every stage. Both oversubscribe the cores and
# hang_train measures elapsed time, so they run alone.
set(ZT_MPI_TEST_ENV "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMP_NUM_THREADS=1;PYTHONDONTWRITEBYTECODE=1")
add_test(NAME zero_matrix
         COMMAND ${ZT_PYTHON} ${CMAKE_SOURCE_DIR}/test/mpi/zero_matrix.py --train $<TARGET_FILE:train>
                 --mpirun ${MPIEXEC_EXECUTABLE}
         WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
add_test(NAME hang_train
         COMMAND bash ${CMAKE_SOURCE_DIR}/test/mpi/hang_train.sh $<TARGET_FILE:train> ${MPIEXEC_EXECUTABLE}
         WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
# memory_check: per-rank memory of every category against formulas written in the test (stages 0-3,
# world 1 and 3, estimate and real runs), and rank 0's VmHWM against tracked + init transient +
# a runtime overhead measured on a small model; about 15 s.
add_test(NAME memory_check
         COMMAND ${ZT_PYTHON} ${CMAKE_SOURCE_DIR}/test/mpi/memory_check.py --train $<TARGET_FILE:train>
                 --mpirun ${MPIEXEC_EXECUTABLE}
         WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
# recompute_check: every recompute policy against none at N = 1 stage 0 and N = 3 stage 3, whole
# logits and classifier chunks of 37 positions: losses, grad norms and final weights bit for bit
# (chunked against whole: tolerances), bytes per step vs theory, tracked memory vs estimate;
# about two minutes.
add_test(NAME recompute_check
         COMMAND ${ZT_PYTHON} ${CMAKE_SOURCE_DIR}/test/mpi/recompute_check.py --train $<TARGET_FILE:train>
                 --mpirun ${MPIEXEC_EXECUTABLE}
         WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
set_tests_properties(recompute_check PROPERTIES TIMEOUT 420 RUN_SERIAL TRUE ENVIRONMENT "${ZT_MPI_TEST_ENV}")
# trace_check: run.trace on a 2-rank ZeRO-2 run with overlap on and off: well-formed events, one
# process per rank after scripts/trace_merge, and reduce-scatters that overlap a later unit's
# backward with overlap on (none with it off); about 10 s.
add_test(NAME trace_check
         COMMAND ${ZT_PYTHON} ${CMAKE_SOURCE_DIR}/test/mpi/trace_check.py --train $<TARGET_FILE:train>
                 --mpirun ${MPIEXEC_EXECUTABLE}
         WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
set_tests_properties(trace_check PROPERTIES TIMEOUT 300 RUN_SERIAL TRUE ENVIRONMENT "${ZT_MPI_TEST_ENV}")
# offload_check: offload.optimizer nvme (docs/design.md §3.6) against the same plan in memory, bit for
# bit, N 1 and 3 x stages 1-3; peak resident memory falls by >= 80% of the moments; swap files are
# unnamed during a run and gone after it, after every signal and after an error, stale ones of dead
# processes removed at start; about 60 s. Then
# offload.params nvme at stage 3 (alone and with the optimizer, N 1 and 3, grad_accum 1 and 2) the
# same way, VmHWM falling by >= 80% of all model states with both; about 75 s more.
add_test(NAME offload_check
         COMMAND ${ZT_PYTHON} ${CMAKE_SOURCE_DIR}/test/mpi/offload_check.py --train $<TARGET_FILE:train>
                 --mpirun ${MPIEXEC_EXECUTABLE}
         WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
set_tests_properties(offload_check PROPERTIES TIMEOUT 600 RUN_SERIAL TRUE ENVIRONMENT "${ZT_MPI_TEST_ENV}")
set_tests_properties(zero_matrix PROPERTIES TIMEOUT 1200 RUN_SERIAL TRUE ENVIRONMENT "${ZT_MPI_TEST_ENV}")
set_tests_properties(memory_check PROPERTIES TIMEOUT 300 RUN_SERIAL TRUE ENVIRONMENT "${ZT_MPI_TEST_ENV}")
set_tests_properties(hang_train PROPERTIES TIMEOUT 300 RUN_SERIAL TRUE ENVIRONMENT "${ZT_MPI_TEST_ENV}")

# ---- several hosts for real: network namespaces (scripts/cluster), Open MPI over TCP -----------
# multihost_matrix: every stage at 3 hosts x 1 rank (overlap on, grad_accum 1; off, grad_accum 3)
# and 2 hosts x 2 ranks (overlap on) against the single-rank reference, 8 steps, bytes per step vs
# theory (zero_matrix.py --hosts). multihost_faults: a cut link and a kill -9 on a remote host end
# every rank, every daemon and mpirun within comm.timeout_s + 10 s, nothing left behind. Both need
# root and iproute2; elsewhere they report Skipped (exit 77) with the reason, never Passed.
add_test(NAME multihost_matrix
         COMMAND ${ZT_PYTHON} ${CMAKE_SOURCE_DIR}/test/mpi/zero_matrix.py --train $<TARGET_FILE:train>
                 --hosts 3x1,2x2 --steps 8
         WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
add_test(NAME multihost_faults
         COMMAND ${ZT_PYTHON} ${CMAKE_SOURCE_DIR}/test/mpi/multihost_faults.py --train $<TARGET_FILE:train>
         WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
set_tests_properties(multihost_matrix multihost_faults PROPERTIES RUN_SERIAL TRUE SKIP_RETURN_CODE 77
                     TIMEOUT 600 ENVIRONMENT "${ZT_MPI_TEST_ENV}")

# ---- the Comm layer under mpirun: collectives, byte counts, ring buffer; a skipped collective ----
add_executable(zt_test_comm ${CMAKE_SOURCE_DIR}/test/mpi/test_comm.cpp)
target_link_libraries(zt_test_comm PRIVATE zt GTest::gtest)  # its own main (MPI + agreement across ranks)
foreach(np 1 2 3 4)
  add_test(NAME mpi_comm_np${np} COMMAND ${MPIEXEC_EXECUTABLE} --oversubscribe -np ${np} $<TARGET_FILE:zt_test_comm>)
  set_tests_properties(mpi_comm_np${np} PROPERTIES RUN_SERIAL TRUE TIMEOUT 120 ENVIRONMENT "${ZT_MPI_TEST_ENV}")
endforeach()
# The naive paths beside the ring collectives (src/comm/ring.h): MPI's own collectives on the comm
# thread, and no thread at all.
add_test(NAME mpi_comm_np3_mpi_collectives COMMAND ${MPIEXEC_EXECUTABLE} --oversubscribe -np 3 $<TARGET_FILE:zt_test_comm>)
set_tests_properties(mpi_comm_np3_mpi_collectives PROPERTIES RUN_SERIAL TRUE TIMEOUT 120
                     ENVIRONMENT "${ZT_MPI_TEST_ENV};ZT_COMM_RING=0")
add_test(NAME mpi_comm_np3_no_thread COMMAND ${MPIEXEC_EXECUTABLE} --oversubscribe -np 3 $<TARGET_FILE:zt_test_comm>)
set_tests_properties(mpi_comm_np3_no_thread PROPERTIES RUN_SERIAL TRUE TIMEOUT 120
                     ENVIRONMENT "${ZT_MPI_TEST_ENV};ZT_COMM_THREAD=0")
# In-memory resume (docs/design.md §3.9): steps 0-9 against 0-4 + rebuild from the step-5
# TrainState + 5-9, bit for bit, every stage; a few seconds per world size.
add_executable(zt_test_resume ${CMAKE_SOURCE_DIR}/test/mpi/test_resume.cpp)
target_link_libraries(zt_test_resume PRIVATE zt GTest::gtest)  # its own main (MPI)
foreach(np 1 3)
  add_test(NAME resume_np${np} COMMAND ${MPIEXEC_EXECUTABLE} --oversubscribe -np ${np} $<TARGET_FILE:zt_test_resume>
           WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
  set_tests_properties(resume_np${np} PROPERTIES RUN_SERIAL TRUE TIMEOUT 300 ENVIRONMENT "${ZT_MPI_TEST_ENV}")
endforeach()
add_executable(zt_hang_probe ${CMAKE_SOURCE_DIR}/test/mpi/hang_probe.cpp)
target_link_libraries(zt_hang_probe PRIVATE zt)
add_test(NAME mpi_comm_hang COMMAND bash ${CMAKE_SOURCE_DIR}/test/mpi/hang_test.sh $<TARGET_FILE:zt_hang_probe>
                                    ${MPIEXEC_EXECUTABLE})
set_tests_properties(mpi_comm_hang PROPERTIES RUN_SERIAL TRUE TIMEOUT 60 ENVIRONMENT "${ZT_MPI_TEST_ENV}")
# Start-up checks with state before and after, several ranks or a terminal: an earlier run's files
# survive (moved aside), final weights into new directories / onto a full disk, data smaller than a
# global batch at np 3, memory counted per host, progress decorations only on a terminal.
add_test(NAME cli_startup_checks
         COMMAND bash ${CMAKE_SOURCE_DIR}/test/cli/startup_checks.sh $<TARGET_FILE:train> ${MPIEXEC_EXECUTABLE}
         WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
set_tests_properties(cli_startup_checks PROPERTIES RUN_SERIAL TRUE TIMEOUT 180 ENVIRONMENT "${ZT_MPI_TEST_ENV}")
add_test(NAME plan_mismatch COMMAND bash ${CMAKE_SOURCE_DIR}/test/mpi/plan_mismatch.sh $<TARGET_FILE:train> ${MPIEXEC_EXECUTABLE}
         WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
set_tests_properties(plan_mismatch PROPERTIES RUN_SERIAL TRUE TIMEOUT 90 ENVIRONMENT "${ZT_MPI_TEST_ENV}")

# ---- GPU: each CUDA op against its CPU op, the whole model against the CPU backend ----------------
# Built whenever the CUDA backend is; every test starts with ZT_REQUIRE_GPU(), which reports it as
# skipped (gtest's [  SKIPPED ], which ctest turns into "Skipped", never "Passed") on machines
# without a GPU. `make test-gpu` runs only these (label gpu).
if(ZT_HAVE_CUDA)
  file(GLOB ZT_GPU_TESTS CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/test/gpu/test_*.cpp)
  add_executable(zt_gpu_tests ${ZT_GPU_TESTS})
  target_link_libraries(zt_gpu_tests PRIVATE zt GTest::gtest GTest::gtest_main)
  gtest_discover_tests(zt_gpu_tests DISCOVERY_TIMEOUT 60
                       PROPERTIES LABELS gpu SKIP_REGULAR_EXPRESSION "\\[  SKIPPED \\]"
                                  ENVIRONMENT "OMP_NUM_THREADS=2;OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1")
  # ZT_EXPECT_GPU=1 turns "no GPU" into failures (gpu_test_util.h); checked with every device hidden,
  # so it means the same with and without a GPU.
  add_test(NAME gpu_expect_switch COMMAND bash ${CMAKE_SOURCE_DIR}/test/gpu/expect_gpu.sh $<TARGET_FILE:zt_gpu_tests>)
  set_tests_properties(gpu_expect_switch PROPERTIES LABELS gpu TIMEOUT 60)
  # Device memory on a GPU: estimate == tracked <= cudaMemGetInfo's count <= estimate + 2% + 64 MiB
  # (scripts/device/memory_check.py; exit 77 = skipped without a GPU).
  add_test(NAME gpu_memory_estimate COMMAND ${ZT_PYTHON} ${CMAKE_SOURCE_DIR}/scripts/device/memory_check.py
           $<TARGET_FILE:train> --quick)
  set_tests_properties(gpu_memory_estimate PROPERTIES LABELS gpu TIMEOUT 300 SKIP_RETURN_CODE 77)
  add_executable(zt_bench_kernels ${CMAKE_SOURCE_DIR}/test/gpu/bench_kernels.cpp)
  target_link_libraries(zt_bench_kernels PRIVATE zt)
endif()

# ---- the CUDA backend under emulation (label emu): the GPU tests and a short device=cuda run -------
# test/emu/README.md: the CUDA sources compiled for the CPU against an emulated runtime / cuBLASLt /
# CUB that checks device-memory access from the host, copy directions, cuBLASLt layouts and
# alignment, and the ordering of work across streams. Every test name starts with "emulated.".
# `make test-emu` runs only these.
if(ZT_HAVE_CUDA AND ZT_CUDA_SOURCES)
  include(${CMAKE_SOURCE_DIR}/test/emu/emu.cmake)
  # The CUDA backend's multi-rank paths (collectives host-staged through MPI, zero/staged_comm.h):
  # mpirun -np 2 (stages 0-3, fp32 and bf16) and -np 3 (stages 1, 3, fp32) of zt_train_emu against
  # N = 1 and the CPU backend (test/emu/multirank_emu.sh).
  add_test(NAME emulated.multirank_cuda
           COMMAND bash ${CMAKE_SOURCE_DIR}/test/emu/multirank_emu.sh $<TARGET_FILE:train> $<TARGET_FILE:zt_train_emu>
                   ${MPIEXEC_EXECUTABLE}
           WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
  set_tests_properties(emulated.multirank_cuda PROPERTIES LABELS emu TIMEOUT 600 RUN_SERIAL TRUE
                       ENVIRONMENT "OMP_NUM_THREADS=1;OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1")
  # offload.optimizer cpu / nvme on the CUDA backend against the same plan without offload, N = 1
  # stage 1 and N = 2 stage 3, fp32 and bf16; estimate == tracked (test/emu/offload_emu.sh).
  add_test(NAME emulated.offload_cuda
           COMMAND bash ${CMAKE_SOURCE_DIR}/test/emu/offload_emu.sh $<TARGET_FILE:zt_train_emu> ${MPIEXEC_EXECUTABLE}
           WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
  set_tests_properties(emulated.offload_cuda PROPERTIES LABELS emu TIMEOUT 600 RUN_SERIAL TRUE
                       ENVIRONMENT "OMP_NUM_THREADS=1;OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1")
endif()

# ---- scripts/compare: the table, CSV and charts report what the runs logged ----------------------
add_test(NAME compare_plans
         COMMAND ${ZT_PYTHON} ${CMAKE_SOURCE_DIR}/test/cli/compare_check.py --train $<TARGET_FILE:train>
         WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
set_tests_properties(compare_plans PROPERTIES RUN_SERIAL TRUE TIMEOUT 300 ENVIRONMENT "${ZT_MPI_TEST_ENV}")

# ---- layering: who may include whom (docs/design.md §2), on the #include lines of src/ ----------
add_test(NAME include_rules COMMAND ${ZT_PYTHON} ${CMAKE_SOURCE_DIR}/test/lint/include_rules.py ${CMAKE_SOURCE_DIR})
set_tests_properties(include_rules PROPERTIES ENVIRONMENT "PYTHONDONTWRITEBYTECODE=1")

# ---- README.md and docs/: every link, repository path and source file named exists ---------------
add_test(NAME doc_links COMMAND ${ZT_PYTHON} ${CMAKE_SOURCE_DIR}/test/lint/doc_links.py ${CMAKE_SOURCE_DIR})
set_tests_properties(doc_links PROPERTIES ENVIRONMENT "PYTHONDONTWRITEBYTECODE=1")

# ---- docs/zero.md: every memory and traffic formula against `train estimate --json` --------------
add_test(NAME zero_doc_formulas
         COMMAND ${ZT_PYTHON} ${CMAKE_SOURCE_DIR}/test/unit/zero_doc_check.py --train $<TARGET_FILE:train>
         WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
set_tests_properties(zero_doc_formulas PROPERTIES TIMEOUT 300 ENVIRONMENT "PYTHONDONTWRITEBYTECODE=1")

# ---- sharded checkpoints (docs/design.md §3.7), test/checkpoint/checkpoint_test.py ---------------
# resume: 20 steps vs 10 + resume + 10, bit for bit, stages 0-3 x world 1 and 3 (~35 s);
# reshard: saved at world 4 stage 3, resumed at worlds 2/3/1 and stages 1/0/2 (~20 s); files: model.h5
# and export against run.final_weights, keep, shape refusal (~8 s); faults: corruption, kill -9 in a
# save, SIGTERM (~35 s). They oversubscribe the cores; the SIGTERM case needs the run still going
# after its third step, which it is by a wide margin (60 steps).
foreach(part resume reshard files faults)
  add_test(NAME checkpoint_${part}
           COMMAND ${ZT_PYTHON} ${CMAKE_SOURCE_DIR}/test/checkpoint/checkpoint_test.py ${part} --train $<TARGET_FILE:train>
                   --mpirun ${MPIEXEC_EXECUTABLE}
           WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
  set_tests_properties(checkpoint_${part} PROPERTIES TIMEOUT 300 RUN_SERIAL TRUE ENVIRONMENT "${ZT_MPI_TEST_ENV}")
endforeach()
# checkpoint.dir safety, test/checkpoint/checkpoint_dir_test.py: `latest` missing or dangling, another
# run's directory, a second run on a locked directory, a save onto a full disk (tmpfs: root), rank
# files of different saves, plan changes on resume; other runs' directories compared by sha256.
add_test(NAME checkpoint_dir
         COMMAND ${ZT_PYTHON} ${CMAKE_SOURCE_DIR}/test/checkpoint/checkpoint_dir_test.py --train $<TARGET_FILE:train>
                 --mpirun ${MPIEXEC_EXECUTABLE}
         WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
set_tests_properties(checkpoint_dir PROPERTIES TIMEOUT 300 RUN_SERIAL TRUE ENVIRONMENT "${ZT_MPI_TEST_ENV}")

# ---- benchmarks, not tests: scripts/bench_offload.sh runs it -------------------------------------
add_executable(zt_bench_offload ${CMAKE_SOURCE_DIR}/test/bench/bench_offload.cpp)
target_link_libraries(zt_bench_offload PRIVATE zt)
target_compile_options(zt_bench_offload PRIVATE -fno-math-errno)

# ---- output paths: every file the binary and the scripts write goes through one check -------------
# export --out / run.final_weights / run.trace / trace_merge / compare onto devices, links, their own
# inputs and directories (nothing else changes); traces moved aside on a rerun; a trace on a full
# disk (a small tmpfs, root only) loses the trace, not the summary. About 30 s.
add_test(NAME cli_output_paths
         COMMAND bash ${CMAKE_SOURCE_DIR}/test/cli/output_paths.sh $<TARGET_FILE:train> ${MPIEXEC_EXECUTABLE}
         WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
set_tests_properties(cli_output_paths PROPERTIES RUN_SERIAL TRUE TIMEOUT 300 ENVIRONMENT "${ZT_MPI_TEST_ENV}")

# Resumed runs report the steps they ran, a finished one says "nothing to do", console and metrics
# JSONL number steps alike (test/cli/resume_report.sh, three small runs, a few seconds).
add_test(NAME cli_resume_report COMMAND bash ${CMAKE_SOURCE_DIR}/test/cli/resume_report.sh $<TARGET_FILE:train>
         WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
set_tests_properties(cli_resume_report PROPERTIES ENVIRONMENT "OMP_NUM_THREADS=1")
# ---- the unit suite under OpenBLAS's Haswell kernels ---------------------------------------------
# Whether a BLAS call sums a row in the same order for any number of rows depends on the kernel:
# OpenBLAS's AVX-512 kernels (the default on many machines) happen to on small shapes, its Haswell
# and Zen kernels do not, so a claim of equal bits across row counts passed on one machine and
# failed on another. The unit binary runs again with OPENBLAS_CORETYPE=Haswell, but for
# Shapes/Attention.Gradients (finite differences of our own attention kernel, no BLAS: 40 of the
# suite's 55 s): about 15 s more. Skipped without AVX2/FMA or where OpenBLAS ignores the variable.
add_test(NAME unit_openblas_haswell
         COMMAND bash ${CMAKE_SOURCE_DIR}/test/unit/openblas_kernel.sh Haswell avx2,fma $<TARGET_FILE:zt_tests>
                 --gtest_filter=-Shapes/Attention.Gradients/*
         WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
set_tests_properties(unit_openblas_haswell PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 300
                     ENVIRONMENT "OMP_NUM_THREADS=2")
# ---- issue 23 (plan and command line): comm.* plan keys reach the comm, estimate without a GPU ------
# comm_settings: 2 ranks with comm.ring false / ZT_COMM_THREAD=0 train the defaults' losses, plan.json
# records what ran, a rank with a different override is refused; about 15 s.
add_test(NAME comm_settings COMMAND bash ${CMAKE_SOURCE_DIR}/test/mpi/comm_settings.sh $<TARGET_FILE:train>
                                    ${MPIEXEC_EXECUTABLE}
         WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
set_tests_properties(comm_settings PROPERTIES RUN_SERIAL TRUE TIMEOUT 300 ENVIRONMENT "${ZT_MPI_TEST_ENV}")
# cli_estimate_cuda: train estimate --set device=cuda with no GPU visible, stages 0-3 x fp32/bf16, and
# the run's own message for a head size the CUDA kernels lack.
if(ZT_HAVE_CUDA)
  add_test(NAME cli_estimate_cuda COMMAND bash ${CMAKE_SOURCE_DIR}/test/cli/estimate_cuda.sh $<TARGET_FILE:train>
           WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
  set_tests_properties(cli_estimate_cuda PROPERTIES TIMEOUT 120)
endif()
# make_retry: a failed configure is run again by the next `make` (Makefile's configure stamp); 1 s.
add_test(NAME make_retry COMMAND bash ${CMAKE_SOURCE_DIR}/test/cli/make_retry.sh WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
