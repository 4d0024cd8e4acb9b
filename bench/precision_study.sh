#!/bin/sh
# Precision study: does the default precision policy (resident Q8_0 for attention / MLP / head,
# F16 for recurrent GDN projections, host compute "auto") learn as well as the FP32 path
# (--precision f32 --compute f32)? For each architecture, a `small` synthetic model (F32
# weights, so the two paths really differ) is trained with LoRA on the example tagging task
# (examples/tagging-train.jsonl) once per precision, with the same seed and hyper-parameters,
# and its held-out accuracy (examples/tagging-test.jsonl, 120 labelled notes, 5 tags) is
# measured with `nightlora eval` at the same precision it was trained with. The base model's
# accuracy (no adapter) is the reference.
#
# MeZO rows (forward-only training) are added when `nightlora train` knows --method: one run at
# the backprop run's step count and one at its wall-clock time. Skipped otherwise.
#
#   sh bench/precision_study.sh                  # all archs, results in out/precision-study/
#   ARCHS=qwen3 EPOCHS=1 sh bench/precision_study.sh
#
# Environment: BIN (build/nightlora), OUT (out/precision-study), ARCHS ("llama qwen3 qwen35"),
# PRESET (small), EPOCHS (3), LR (2e-3), BATCH (256), THREADS (2), SEED (1), MEZO_LR (1e-4), MEZO_EPS (1e-3),
# NICE (10; "" = not niced).
set -e
BIN=${BIN:-build/nightlora}
OUT=${OUT:-out/precision-study}
ARCHS=${ARCHS:-"llama qwen3 qwen35"}
EPOCHS=${EPOCHS:-3}
LR=${LR:-2e-3}
BATCH=${BATCH:-256}
THREADS=${THREADS:-2}
SEED=${SEED:-1}
PRESET=${PRESET:-small}
MEZO_LR=${MEZO_LR:-1e-4}
MEZO_EPS=${MEZO_EPS:-1e-3}
NICE=${NICE-10}
TRAIN=examples/tagging-train.jsonl
TEST=examples/tagging-test.jsonl
RUN=""
[ -n "$NICE" ] && RUN="nice -n $NICE"
mkdir -p "$OUT"
RES="$OUT/results.md"

# Does this build's train know --method? (an unknown option is reported before anything runs)
if "$BIN" train --method mezo 2>&1 | grep -q "unknown option '--method'"; then HAVE_MEZO=0; else HAVE_MEZO=1; fi

flags_for() { # precision name -> service flags
    case "$1" in
    default) echo "--backend host --threads $THREADS --precision auto" ;; # eval too: as trained
    f32) echo "--backend host --threads $THREADS --precision f32 --compute f32" ;;
    esac
}

# eval MODEL ADAPTER|"" PREC LOG -> prints "acc% (n/N) loss"
evaluate() {
    ad=""
    [ -n "$2" ] && ad="--adapter $2"
    # shellcheck disable=SC2046
    $RUN "$BIN" eval --model "$1" $ad --data "$TEST" $(flags_for "$3") >"$4" 2>&1 || { cat "$4" >&2; exit 1; }
    sed -n 's/.*loss \([0-9.]*\), ppl.*accuracy \([0-9.]*%\) (\([0-9]*\/[0-9]*\)).*/\2 (\3)|\1/p' "$4" | tail -1
}

# train MODEL OUT_ADAPTER PREC LOG [extra args] -> prints "seconds steps first_loss last_loss"
train() {
    m=$1 a=$2 p=$3 log=$4
    shift 4
    t0=$(date +%s.%N)
    # shellcheck disable=SC2046
    $RUN "$BIN" train --model "$m" --data "$TRAIN" --out "$a" $(flags_for "$p") --batch-tokens "$BATCH" \
        --seed "$SEED" --log-json "$log.jsonl" "$@" >"$log" 2>&1 || { cat "$log" >&2; exit 1; }
    t1=$(date +%s.%N)
    d=$(sed -n 's/^done after \([0-9]*\)\/[0-9]* steps: loss \([0-9.]*\) -> \([0-9.]*\).*/\1 \2 \3/p' "$log")
    echo "$(echo "$t1 - $t0" | bc) $d"
}

{
    echo "| arch | precision | resident weights (train) | steps | train s | loss first → last | held-out accuracy | held-out loss |"
    echo "|---|---|---|---|---|---|---|---|"
} >"$RES"
for arch in $ARCHS; do
    model="$OUT/$arch-$PRESET.gguf"
    "$BIN" mkmodel --arch "$arch" --preset "$PRESET" --type f32 --seed "$SEED" --out "$model" >/dev/null
    for p in default f32; do
        r=$(evaluate "$model" "" "$p" "$OUT/$arch-base-$p.eval")
        echo "| $arch | $p | (base model, no adapter) | - | - | - | ${r%%|*} | ${r##*|} |" >>"$RES"
    done
    for p in default f32; do
        echo "== $arch, $p: training" >&2
        tr=$(train "$model" "$OUT/$arch-$p.gguf" "$p" "$OUT/$arch-$p.train" --epochs "$EPOCHS" --lr "$LR" --warmup 5)
        set -- $tr
        secs=$1 steps=$2 l0=$3 l1=$4
        [ "$p" = default ] && { bp_secs=$secs; bp_steps=$steps; }
        resident=$(sed -n 's/^service:.*resident \(.*\)$/\1/p' "$OUT/$arch-$p.train" | head -1)
        r=$(evaluate "$model" "$OUT/$arch-$p.gguf" "$p" "$OUT/$arch-$p.eval")
        printf '| %s | %s | %s | %s | %.0f | %s → %s | %s | %s |\n' "$arch" "$p" "$resident" "$steps" "$secs" "$l0" "$l1" \
            "${r%%|*}" "${r##*|}" >>"$RES"
    done
    if [ "$HAVE_MEZO" = 1 ]; then
        # equal steps, then equal wall-clock (steps scaled by the measured MeZO step time)
        echo "== $arch, MeZO at $bp_steps steps" >&2
        tr=$(train "$model" "$OUT/$arch-mezo.gguf" default "$OUT/$arch-mezo.train" --method mezo --steps "$bp_steps" \
            --lr "$MEZO_LR" --mezo-eps "$MEZO_EPS" --dropout 0)
        set -- $tr
        r=$(evaluate "$model" "$OUT/$arch-mezo.gguf" default "$OUT/$arch-mezo.eval")
        printf '| %s | default, MeZO (equal steps) | | %s | %.0f | %s → %s | %s | %s |\n' "$arch" "$2" "$1" "$3" "$4" \
            "${r%%|*}" "${r##*|}" >>"$RES"
        wc_steps=$(echo "$bp_secs * $2 / $1" | bc)
        echo "== $arch, MeZO at $wc_steps steps (backprop's wall-clock)" >&2
        tr=$(train "$model" "$OUT/$arch-mezo-wc.gguf" default "$OUT/$arch-mezo-wc.train" --method mezo --steps "$wc_steps" \
            --lr "$MEZO_LR" --mezo-eps "$MEZO_EPS" --dropout 0)
        set -- $tr
        r=$(evaluate "$model" "$OUT/$arch-mezo-wc.gguf" default "$OUT/$arch-mezo-wc.eval")
        printf '| %s | default, MeZO (equal wall-clock) | | %s | %.0f | %s → %s | %s | %s |\n' "$arch" "$2" "$1" "$3" "$4" \
            "${r%%|*}" "${r##*|}" >>"$RES"
    else
        echo "== $arch: MeZO rows skipped (this nightlora's train has no --method)" >&2
    fi
done
{
    echo
    echo "Machine: $(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo 2>/dev/null | head -1), $(nproc) CPUs, --threads $THREADS;" \
        "$("$BIN" --version 2>/dev/null || echo "nightlora $(git rev-parse --short HEAD 2>/dev/null || echo '?')"); $(date -u +%Y-%m-%d)."
    echo "Settings: mkmodel --preset $PRESET --type f32 --seed $SEED; train --epochs $EPOCHS --lr $LR --warmup 5" \
        "--batch-tokens $BATCH --seed $SEED (rank 16, alpha 32, dropout 0.05, every projection)."
    [ "$HAVE_MEZO" = 1 ] || echo "MeZO rows: skipped (train has no --method)."
} >>"$RES"
cat "$RES"
