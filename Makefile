# The README's two commands:
#   make demo  — install dependencies, build, run the main job
#   make test  — install dependencies, build, run every test (plus an ASan+UBSan pass)
JOBS ?= $(shell nproc)

.PHONY: deps build demo test test-fast test-asan bench fuzz clean

deps:
	bash scripts/setup.sh

build: deps
	cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
	cmake --build build -j $(JOBS)

demo: build
	bash examples/demo.sh

test-fast: build
	ctest --test-dir build --output-on-failure -j $(JOBS)

test-asan: deps
	cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DCOLT_SANITIZE=ON
	cmake --build build-asan -j $(JOBS)
	ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 OMP_NUM_THREADS=2 \
	  ctest --test-dir build-asan --output-on-failure -j $(JOBS)

test: test-fast test-asan

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
