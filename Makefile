# The README's two commands:
#   make demo  — install dependencies, build, run the main job
#   make test  — install dependencies, build, run every test (plus an ASan+UBSan pass), then a summary
# OMP_WAIT_POLICY=passive for the tests: the test programs' OpenMP threads would otherwise spin while
# other tests run on the same cores (the colt binary sets it for itself, src/cli/main.c).
# The ASan pass runs one OpenMP and one OpenBLAS thread per process: its tests run two at a time and the
# multi-rank ones start 2-4 ranks each, so more threads only oversubscribe the cores.
JOBS ?= $(shell nproc)

.PHONY: deps build build-cuda demo test test-fast test-asan test-gpu bench fuzz clean

deps:
	bash scripts/setup.sh

build: deps
	cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
	cmake --build build -j $(JOBS)

demo: build
	bash examples/demo.sh

test-fast: build
	OMP_WAIT_POLICY=passive ctest --test-dir build --output-on-failure -j $(JOBS)

test-asan: deps
	cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DCOLT_SANITIZE=ON
	cmake --build build-asan -j $(JOBS)
	ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 OMP_WAIT_POLICY=passive \
	  ctest --test-dir build-asan --output-on-failure -j $(JOBS)

# CI has no GPU: it compiles and links the CUDA backend (when nvcc is there) and runs the CPU tests.
# Each suite runs whatever the one before did, its output teed to build/test-logs/; the last lines
# are one per suite and a total (scripts/test_summary.sh), and the exit status is non-zero when any
# suite failed. Each suite's time goes to <suite>.seconds and onto its summary line.
TEST_LOGS = build/test-logs
test:
	@mkdir -p $(TEST_LOGS) && rm -f $(TEST_LOGS)/*.rc $(TEST_LOGS)/*.log $(TEST_LOGS)/*.seconds
	@{ t0=$$(date +%s); $(MAKE) --no-print-directory test-fast; echo $$? > $(TEST_LOGS)/release.rc; \
	   echo $$(( $$(date +%s) - t0 )) > $(TEST_LOGS)/release.seconds; } 2>&1 | tee $(TEST_LOGS)/release.log
	@{ t0=$$(date +%s); $(MAKE) --no-print-directory test-asan; echo $$? > $(TEST_LOGS)/asan.rc; \
	   echo $$(( $$(date +%s) - t0 )) > $(TEST_LOGS)/asan.seconds; } 2>&1 | tee $(TEST_LOGS)/asan.log
	@{ t0=$$(date +%s); $(MAKE) --no-print-directory build-cuda; echo $$? > $(TEST_LOGS)/cuda.rc; \
	   echo $$(( $$(date +%s) - t0 )) > $(TEST_LOGS)/cuda.seconds; } 2>&1 | tee $(TEST_LOGS)/cuda.log
	@bash scripts/test_summary.sh $(TEST_LOGS)

NVCC ?= $(shell command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
build-cuda: deps
	@if [ -z "$(NVCC)" ]; then echo "build-cuda: no nvcc found, CUDA backend not compiled"; else \
	  cmake -S . -B build-cuda -DCMAKE_BUILD_TYPE=Release -DCOLT_CUDA=ON -DCMAKE_CUDA_COMPILER=$(NVCC) && \
	  cmake --build build-cuda -j $(JOBS); fi

# On a machine with an NVIDIA GPU: every CUDA op against the CPU op, model-level checks.
test-gpu: build-cuda
	ctest --test-dir build-cuda -L gpu --output-on-failure

bench: build
	bash bench/run_cpu.sh

# libFuzzer targets (clang). FUZZ_SECONDS per target.
FUZZ_SECONDS ?= 60
fuzz: deps
	CC=clang cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCOLT_FUZZ=ON
	cmake --build build-fuzz -j $(JOBS)
	bash fuzz/run.sh build-fuzz $(FUZZ_SECONDS)

clean:
	rm -rf build build-asan build-fuzz
