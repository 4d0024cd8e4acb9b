# The README's two commands: `make demo` and `make test`.
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
ifeq ($(SANITIZE),1)
BUILD ?= build-san
CMAKE_FLAGS += -DNL_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug
else
BUILD ?= build
endif

.PHONY: all build demo test install clean fuzz phone

all: build

build:
	@cmake -S . -B $(BUILD) $(CMAKE_FLAGS) >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

# the build as one line (its log in $(BUILD)/build.log, the end of it shown when it fails), then the demo
demo:
	@cmake -S . -B $(BUILD) $(CMAKE_FLAGS) >/dev/null
	@printf 'building nightlora in $(BUILD)/ ... '; \
	if cmake --build $(BUILD) -j $(JOBS) >$(BUILD)/build.log 2>&1; then echo "done (log: $(BUILD)/build.log)"; \
	else echo "failed:"; tail -n 40 $(BUILD)/build.log; exit 1; fi
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

# The phone build: a static AArch64 CLI, build-aarch64/nightlora (Debian's gcc-aarch64-linux-gnu;
# copy it to the phone and run it: docs/real-models.md, "On a phone"). CI runs it under qemu.
phone:
	@cmake -S . -B build-aarch64 -DCMAKE_TOOLCHAIN_FILE=$(CURDIR)/cmake/aarch64.cmake -DNL_STATIC_CLI=ON >/dev/null
	@cmake --build build-aarch64 -j $(JOBS) --target nightlora_cli
	@echo "build-aarch64/nightlora: a static aarch64 nightlora"

clean:
	rm -rf build build-san build-fuzz build-aarch64
