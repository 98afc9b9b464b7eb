# Quick start: `make demo` runs the main job, `make check` runs the tests.
# Both install what is missing (Debian 12, root) and build first.
JOBS ?= $(shell nproc)
S ?= bus
CTEST_TIMEOUT ?= 600
FUZZ_SECONDS ?= 60
# make check TSAN=0 leaves out the ThreadSanitizer run, for machines where TSan cannot
# map its shadow memory (e.g. kernels with vm.mmap_rnd_bits above 28).
TSAN ?= 1

.PHONY: all demo check deps build build-asan build-tsan bench fuzz format clean

all: build

deps:
	@scripts/install-deps.sh

build: deps
	@cmake --preset default -DDSEC_WERROR=ON >/dev/null
	@cmake --build --preset default -j $(JOBS)

build-asan: deps
	@cmake --preset asan -DDSEC_WERROR=ON >/dev/null
	@cmake --build --preset asan -j $(JOBS)

# Only the targets of the tsan test preset (CMakePresets.json).
build-tsan: deps
	@cmake --preset tsan -DDSEC_WERROR=ON >/dev/null
	@cmake --build --preset tsan -j $(JOBS)

demo: build
	@./build/default/tools/dsec demo

check: build build-asan $(if $(filter 1,$(TSAN)),build-tsan)
	ctest --preset default -j $(JOBS) --timeout $(CTEST_TIMEOUT)
	ctest --preset asan -j $(JOBS) --timeout $(CTEST_TIMEOUT)
ifeq ($(TSAN),1)
	# the bus, actor, scheduler and node tests under ThreadSanitizer (the preset's filter)
	ctest --preset tsan -j $(JOBS) --timeout $(CTEST_TIMEOUT)
endif

bench: deps
	@cmake --preset bench >/dev/null
	@cmake --build --preset bench -j $(JOBS)
	@scripts/bench.sh $(S)

# make fuzz [FUZZ_SECONDS=60]: build the libFuzzer harnesses, run each that long on its corpus
fuzz: deps
	@cmake --preset fuzz >/dev/null
	@cmake --build --preset fuzz -j $(JOBS) --target fuzz_all
	@scripts/fuzz.sh $(FUZZ_SECONDS)

# make format: clang-format every C file in place (.clang-format); `make check` runs the check
format:
	@scripts/format.sh

clean:
	rm -rf build
