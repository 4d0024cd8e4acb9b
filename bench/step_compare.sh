#!/bin/sh
# bench/step_compare.sh: before/after table of one training step (docs/bench-step.md).
# Runs `bench step` (configurations c and d) of two nightlora binaries one after the other on the
# same model, for the default path (Q8_0 resident, bf16 compute where the CPU has AVX512_BF16)
# and the FP32 path (--precision f32 --compute f32), and prints one JSON line per run.
#   bench/step_compare.sh BEFORE_BIN AFTER_BIN MODEL [TOKENS] [THREADS] [REPS]
# The binaries take the sub-command as `bench-step` or `bench step` (set BENCH_CMD).
set -eu
before=$1; after=$2; model=$3; T=${4:-512}; th=${5:-2}; reps=${6:-2}
cmd=${BENCH_CMD:-bench step}
for path in default f32; do
    if [ "$path" = f32 ]; then flags="--precision f32 --compute f32"; else flags=""; fi
    for which in before after; do
        if [ "$which" = before ]; then bin=$before; else bin=$after; fi
        printf '{"path": "%s", "binary": "%s", "result": ' "$path" "$which"
        # shellcheck disable=SC2086
        $bin $cmd --model "$model" --tokens "$T" --threads "$th" --reps "$reps" --warmup 1 --only cd --json $flags | tr -d '\n'
        printf '}\n'
    done
done
