# Front door. The real build is CMake in build/; these targets wrap it.
#   make            build ./train, and the test binaries when GoogleTest is installed
#   make configure  only run CMake (again after a failure: see the stamp below)
#   make train      build ./train alone, prepare the default data if missing, train plans/default.json
#   make test       build everything and run every test through ctest (GPU tests report "Skipped"
#                   without a GPU); needs what `bash scripts/install_deps.sh --test` installs
#   make test-gpu   only the GPU tests: CUDA ops vs CPU ops, the model on the GPU vs the CPU backend
#   make test-emu   the GPU tests and a short device=cuda run under CPU emulation (test/emu, label emu)
#   make test-LABEL one concept's tests (ctest -L LABEL): test-zero, test-tensor, test-pipeline, test-comm,
#                   test-checkpoint, test-offload, test-recompute, test-plan, test-cli, test-model,
#                   test-data, test-parity, test-docs, test-autoplan, test-unit (the second-scale
#                   unit binary); test/tests.cmake lists them
#   make bench      CPU throughput vs PyTorch (scripts/bench_cpu.sh)
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: all build build-tests configure train test test-gpu test-emu bench data clean
all: build

# The stamp is written only when CMake succeeds. A failed configure (a package missing) leaves a
# CMakeCache.txt but no Makefile; keyed on the cache, every later `make` skipped configuring and said
# "No rule to make target 'Makefile'" forever. Its cache goes too, so the retry starts clean.
$(BUILD)/.configured:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS) || { rm -f $(BUILD)/CMakeCache.txt; exit 1; }
	touch $@

configure: $(BUILD)/.configured

build: $(BUILD)/.configured
	cmake --build $(BUILD) -j $(JOBS)

# CMake runs again: the first configure (`make train`) may predate GoogleTest, and without it the
# build has no tests (CMakeLists.txt); ctest then finds none and fails.
build-tests: $(BUILD)/.configured
	cmake $(BUILD)
	cmake --build $(BUILD) -j $(JOBS)

data:
	scripts/prepare_data

# ./train alone: no test binaries, nothing that only the tests need.
train: $(BUILD)/.configured
	cmake --build $(BUILD) -j $(JOBS) --target train
	scripts/prepare_data
	./train plans/default.json

test: build-tests
	cd $(BUILD) && ctest --output-on-failure --no-tests=error -j $(JOBS)

test-gpu: build-tests
	cd $(BUILD) && ctest -L gpu --output-on-failure --no-tests=error

test-emu: build-tests
	cd $(BUILD) && ctest -L emu --output-on-failure --no-tests=error -j $(JOBS)

# Any other label (test/tests.cmake); a label that matches nothing is an error, not a silent pass.
test-%: build
	cd $(BUILD) && ctest -L '^$*$$' --no-tests=error --output-on-failure -j $(JOBS)

bench: build data
	scripts/bench_cpu.sh

clean:
	rm -rf $(BUILD) train
