#!/usr/bin/env bash
# CI (aarch64): the whole trainer cross-built for AArch64 (cmake/aarch64.cmake: Debian's
# gcc-aarch64-linux-gnu) and run under qemu-user, every step bounded by timeout:
#   1. every ctest that is not x86-specific under `-cpu max` (Armv8.x with dotprod, bf16, i8mm,
#      sve, sme in HWCAP/HWCAP2); the CLI the tests run goes through build-aarch64/nightlora-emu;
#      NL_TEST_SMALL=1: the heaviest tests take their smaller cases (tests/test.h nl_t_small)
#   2. the rooms that ask the CPU what it can do (cpu, proj, nn: their ctest labels) again under
#      `-cpu cortex-a53`, a plain Armv8.0 core, so the fallbacks run
#   3. make demo's training run (examples/demo.sh's model and flags) shortened: batches of 128
#      tokens, 6 steps under -cpu max and 3 under -cpu cortex-a53 (DEMO_STEPS_MAX, DEMO_STEPS_A53,
#      DEMO_TOKENS), on the default and the FP32 path; its losses against the x86 build's run of
#      the same length (FP32: every printed loss the same; default: within 2e-2 relative, the x86
#      default path is BF16)
#   4. tools/determinism.sh under qemu against the x86 build's lines: the FP32 lines must be the
#      same; the others are printed with the x86 line beside them (docs/real-models.md, "On a
#      phone", says which differ and why); DET_MODES=f32 runs only the FP32 lines (.ci/run: the
#      four FP32 trainings, ~2 min under qemu; all 20 lines took 6.5 min on one core here)
# Time (qemu on a 2-core x86 machine, loaded, one job at a time): step 1 is well over an hour on
# one core (test_graph 886 s, test_graph_threads ~800, test_faults 438, test_eval 381 before the
# first three's smaller cases); step 3's default path under -cpu max took 649 s (6 steps of 128
# tokens, ~270 s before the first); .ci/run runs all four steps, the demo as 3 + 2 steps (it says why).
# Runs when CI_AARCH64=1, or when the cross tools are already installed; otherwise it says so and
# exits 0. With CI_AARCH64=1 it installs what is missing (Debian 12):
#   gcc-aarch64-linux-gnu qemu-user-static clang-19 (clang builds the SME tile kernel,
#   src/cpu/kernels_sme.c, which gcc 12 cannot; without it the build leaves SME out and says so)
# Usage: .ci/aarch64.sh [build-dir (default build-aarch64)]
#   X86_BUILD=build (the x86 build the losses are compared with; built, incrementally, here)
#   AARCH64_STEPS="tests a53 demo determinism" (which steps)
#   AARCH64_TESTS=REGEX (ctest -R: which tests the two ctest steps run; default every one)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build-aarch64}
X86=${X86_BUILD:-build}
STEPS=${AARCH64_STEPS:-tests a53 demo determinism}
JOBS=${JOBS:-2}
sel=()
[ -n "${AARCH64_TESTS:-}" ] && sel=(-R "$AARCH64_TESTS")
have() { command -v aarch64-linux-gnu-gcc >/dev/null 2>&1 && command -v qemu-aarch64-static >/dev/null 2>&1; }
if ! have; then
  if [ "${CI_AARCH64:-0}" != 1 ]; then
    echo "aarch64: cross tools not installed and CI_AARCH64 != 1: skipped"
    exit 0
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq gcc-aarch64-linux-gnu qemu-user-static cmake make >/dev/null
fi
if [ "${CI_AARCH64:-0}" = 1 ] && ! command -v clang-19 >/dev/null 2>&1; then
  export DEBIAN_FRONTEND=noninteractive
  { apt-get update -qq && apt-get install -y -qq clang-19 >/dev/null; } || echo "aarch64: clang-19 cannot be installed: the SME tile kernel is left out"
fi
step() { echo "== aarch64: $* ($(date -u +%H:%M:%S))"; }
took() { echo "== aarch64: $1 took $(( SECONDS - $2 )) s"; }
on() { case " $STEPS " in *" $1 "*) return 0 ;; esac; return 1; }
t_all=$SECONDS

step "build ($BUILD)"
t=$SECONDS
cmake -S . -B "$BUILD" -DCMAKE_TOOLCHAIN_FILE="$PWD/cmake/aarch64.cmake" -DCMAKE_BUILD_TYPE=Release -DNL_STATIC_CLI=ON \
  -DNL_BUILD_BENCH=OFF >/dev/null
timeout 1800 cmake --build "$BUILD" -j "$JOBS"
took build $t
EMU=(qemu-aarch64-static -L /usr/aarch64-linux-gnu)
CLI=$PWD/$BUILD/nightlora
echo "aarch64 CLI under -cpu max: $(QEMU_CPU=max "${EMU[@]}" "$CLI" --version | head -1)"

# 1. the whole suite under -cpu max (qemu-user reads QEMU_CPU: the tests and the CLI they run)
if on tests; then
  step "ctest under -cpu max"
  t=$SECONDS
  (cd "$BUILD" && QEMU_CPU=max NL_TEST_SMALL=1 timeout 3000 ctest --output-on-failure -j "$JOBS" "${sel[@]}")
  took "ctest -cpu max" $t
fi

# 2. the rooms with CPU-dependent paths under a plain Armv8.0 core
if on a53; then
  step "ctest -L 'cpu|proj|nn' under -cpu cortex-a53"
  t=$SECONDS
  (cd "$BUILD" && QEMU_CPU=cortex-a53 NL_TEST_SMALL=1 timeout 2400 ctest --output-on-failure -j "$JOBS" -L '^(cpu|proj|nn)$' "${sel[@]}")
  took "ctest -cpu cortex-a53" $t
fi

if on demo || on determinism; then
  timeout 1800 make build BUILD="$X86" >/dev/null # (incremental: .ci/run's own make build is then quick)
fi
work=$(mktemp -d "${TMPDIR:-/tmp}/nl_aarch64.XXXXXX")
trap 'rm -rf "$work"' EXIT
losses() { grep -o '"loss":[^,}]*' "$1" | cut -d: -f2 | tr '\n' ' '; }

# 3. make demo's training run, shortened, x86 and both CPU models, default and FP32 paths (the
# small model's step is slow under qemu: 12 steps of 256 tokens on the FP32 path took 446 s under
# -cpu max and 723 s under -cpu cortex-a53 on this 2-core machine, loaded)
if on demo; then
  TOKENS=${DEMO_TOKENS:-128}
  step "make demo's training run ($TOKENS-token batches: ${DEMO_STEPS_MAX:-6} steps -cpu max, ${DEMO_STEPS_A53:-3} -cpu cortex-a53) under qemu against x86"
  t=$SECONDS
  "$X86/nightlora" mkmodel --arch qwen3 --preset small --type q8_0 --seed 1 --out "$work/small.gguf" >/dev/null
  train() { # tag mode steps BIN-prefix...
    local tag=$1 mode=$2 steps=$3; shift 3
    local extra=""
    [ "$mode" = f32 ] && extra="--precision f32 --compute f32"
    # shellcheck disable=SC2086
    timeout 1200 "$@" train --model "$work/small.gguf" --data examples/tagging-train.jsonl --out "$work/$tag-$mode.gguf" \
      --backend host --threads 2 --steps "$steps" --batch-tokens "$TOKENS" --lr 2e-3 --warmup 2 --seed 7 \
      --log-json "$work/$tag-$mode.jsonl" --quiet $extra >"$work/$tag-$mode.log" 2>&1 ||
      { cat "$work/$tag-$mode.log"; echo "aarch64: demo training ($tag, $mode) failed"; exit 1; }
  }
  bad=0
  for mode in default f32; do
    for cpu in max cortex-a53; do
      n=${DEMO_STEPS_MAX:-6}
      [ $cpu = max ] || n=${DEMO_STEPS_A53:-3}
      t_run=$SECONDS
      train "x86-$n" $mode "$n" "$X86/nightlora"
      train "$cpu" $mode "$n" env QEMU_CPU=$cpu "${EMU[@]}" "$CLI"
      echo "demo $mode -cpu $cpu: $n steps in $(( SECONDS - t_run )) s"
      python3 - "$work/x86-$n-$mode.jsonl" "$work/$cpu-$mode.jsonl" "$mode" "$cpu" "$n" <<'EOF' || bad=1
import json, sys
def losses(p):
    return [json.loads(l)["loss"] for l in open(p) if '"loss"' in l]
x, a = losses(sys.argv[1]), losses(sys.argv[2])
mode, cpu, n = sys.argv[3], sys.argv[4], int(sys.argv[5])
if len(x) != n or len(a) != n:
    sys.exit(f"demo {mode} -cpu {cpu}: {len(a)} losses under qemu, {len(x)} on x86, expected {n}")
rel = max(abs(p - q) / abs(q) for p, q in zip(a, x))
same = a == x
print(f"demo {mode} path, -cpu {cpu}: final loss {a[-1]:.6f} (x86 {x[-1]:.6f}), max rel diff {rel:.3g}"
      f"{', every loss the same' if same else ''}")
if mode == "f32" and not same:
    sys.exit(f"demo f32 -cpu {cpu}: losses differ from x86's:\n  {a}\n  {x}")
if rel > 2e-2:
    sys.exit(f"demo {mode} -cpu {cpu}: losses more than 2e-2 from x86's")
EOF
    done
  done
  [ $bad = 0 ] || { echo "aarch64: demo losses differ"; exit 1; }
  took "demo training" $t
fi

# 4. the determinism fingerprint under qemu (-cpu max) against x86's
if on determinism; then
  step "tools/determinism.sh under qemu against x86"
  t=$SECONDS
  printf '#!/bin/sh\nexport QEMU_CPU=max\nexec %s %s "$@"\n' "${EMU[*]}" "$CLI" >"$work/nightlora-max"
  chmod +x "$work/nightlora-max"
  export DET_MODES="${DET_MODES:-default f32 recompute}"
  echo "determinism modes: $DET_MODES"
  timeout 600 sh tools/determinism.sh "$X86/nightlora" "$work/det-x86" >"$work/det-x86.txt"
  timeout 2400 sh tools/determinism.sh "$work/nightlora-max" "$work/det-a64" >"$work/det-a64.txt"
  python3 - "$work/det-x86.txt" "$work/det-a64.txt" <<'EOF'
import sys
x = open(sys.argv[1]).read().splitlines()
a = open(sys.argv[2]).read().splitlines()
if len(x) != len(a):
    sys.exit(f"determinism: {len(a)} lines under qemu, {len(x)} on x86")
bad = 0
for lx, la in zip(x, a):
    key = " ".join(lx.split()[:2])
    if lx == la:
        print(f"same     {key}")
        continue
    # the FP32 path: the same operations in the same order on both
    must = " f32 " in f" {lx} "
    print(f"{'DIFFERS' if must else 'differs'}  {key}\n    x86:     {lx}\n    aarch64: {la}")
    bad += must
if bad:
    sys.exit(f"determinism: {bad} FP32 line(s) differ between x86 and aarch64")
EOF
  took "determinism" $t
fi
took "all aarch64 steps" $t_all
