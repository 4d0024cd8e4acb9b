#!/usr/bin/env bash
# CI: build the libFuzzer harnesses (fuzz/fuzz_*.c) with clang + ASan/UBSan and run each for a
# short time (FUZZ_SECONDS, default 35; 8 harnesses take about 5 minutes). Exits non-zero when a
# harness crashes, leaks, trips a sanitizer or an oracle, or times out on one input; the
# reproducer is left under build-fuzz/smoke/<name>/ and printed. New corpus entries go to a
# scratch folder, never into fuzz/corpus/. Skips (exit 0, with a message) when clang and its
# libFuzzer runtime are missing and cannot be installed.
set -uo pipefail
cd "$(dirname "$0")/.."
SECS=${FUZZ_SECONDS:-35}
CC=${FUZZ_CC:-clang}

have_libfuzzer() {
    command -v "$CC" >/dev/null 2>&1 || return 1
    local d
    d=$(mktemp -d) || return 1
    printf 'int LLVMFuzzerTestOneInput(const unsigned char *d, unsigned long n) { (void)d; (void)n; return 0; }\n' >"$d/t.c"
    "$CC" -fsanitize=fuzzer,address,undefined "$d/t.c" -o "$d/t" >/dev/null 2>&1
    local rc=$?
    rm -rf "$d"
    return $rc
}

if ! have_libfuzzer; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "fuzz-smoke: installing clang and libclang-rt-14-dev"
        export DEBIAN_FRONTEND=noninteractive
        { apt-get update -qq && apt-get install -y -qq clang libclang-rt-14-dev; } >/dev/null 2>&1
    fi
    if ! have_libfuzzer; then
        echo "fuzz-smoke: SKIPPED: $CC with libFuzzer (-fsanitize=fuzzer) is not available"
        exit 0
    fi
fi

echo "fuzz-smoke: building the harnesses (make fuzz)"
log=$(mktemp)
if ! make fuzz FUZZ_CC="$CC" >"$log" 2>&1; then
    tail -40 "$log"
    echo "fuzz-smoke: build failed"
    exit 1
fi
rm -f "$log"

fail=0
for src in fuzz/fuzz_*.c; do
    name=$(basename "$src" .c)
    short=${name#fuzz_}
    work=build-fuzz/smoke/$short
    rm -rf "$work"
    mkdir -p "$work/corpus" "$work/artifacts"
    case $short in
        tok_gguf | adapter) dict=fuzz/dict/gguf.dict ;;
        *) dict=fuzz/dict/$short.dict ;;
    esac
    opts=()
    [ -f "$dict" ] && opts+=("-dict=$dict")
    dirs=("$work/corpus" "fuzz/corpus/$short")
    [ -d "fuzz/crashes/$short" ] && dirs+=("fuzz/crashes/$short")
    ./build-fuzz/"$name" -seed="${FUZZ_SEED:-1}" -max_total_time="$SECS" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 "${opts[@]}" \
        -artifact_prefix="$work/artifacts/" "${dirs[@]}" >"$work/log" 2>&1
    rc=$?
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/log")
    cov=$(grep -E '^#[0-9]+' "$work/log" | tail -1 | sed -n 's/.*cov: \([0-9]*\).*/\1/p')
    if [ $rc -ne 0 ]; then
        fail=1
        echo "fuzz-smoke: $short: FAILED (exit $rc) after ${runs:-?} runs; reproducer(s):"
        ls "$work/artifacts"/* 2>/dev/null | sed 's/^/    /'
        grep -E 'ERROR|oracle failed|SUMMARY' "$work/log" | head -5 | sed 's/^/    /'
    else
        echo "fuzz-smoke: $short: ok, ${runs:-?} runs in ${SECS} s, coverage ${cov:-?}"
    fi
done
exit $fail
