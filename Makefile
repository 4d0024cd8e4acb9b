# The README's two commands: `make demo` and `make test`.
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
ifeq ($(SANITIZE),1)
BUILD ?= build-san
CMAKE_FLAGS += -DNL_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug
else
BUILD ?= build
endif

.PHONY: all build demo test install clean fuzz

all: build

build:
	@cmake -S . -B $(BUILD) $(CMAKE_FLAGS) >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

demo: build
	@sh examples/demo.sh $(BUILD)/nightlora

test: build
	@cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

# The libraries (libnightlora.so, libnightlora.a), nightlora.h, nightlora.pc and the CLI under
# PREFIX (default /usr/local): `make install PREFIX=$$HOME/.local`.
PREFIX ?= /usr/local
install: build
	@cmake --install $(BUILD) --prefix $(PREFIX)

# libFuzzer harnesses (fuzz/fuzz_*.c) with clang + ASan/UBSan into build-fuzz/ (docs/fuzzing.md).
FUZZ_CC ?= clang
fuzz:
	@cmake -S . -B build-fuzz -DNL_FUZZ=ON -DCMAKE_C_COMPILER=$(FUZZ_CC) -DCMAKE_BUILD_TYPE=Debug >/dev/null
	@cmake --build build-fuzz -j $(JOBS) --target fuzzers

clean:
	rm -rf build build-san build-fuzz
