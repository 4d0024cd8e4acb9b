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
#
# STUDY=int8: the int8 compute study instead (issue 22 item 3): `--compute int8` against
# `--compute bf16`, weights resident as stored (--precision keep), same seed, each adapter
# evaluated at the compute it was trained with; on MODELS (default: SmolLM2-135M Q4_1 and
# Gemma 3 270M Q4_K_M from ~/.cache/nightlora, and a synthetic qwen35 `--preset small --type
# q8_0`), INT8_EPOCHS (default 1) for the pretrained models, EPOCHS for the synthetic one.
# Results in $OUT/int8.md. Decision rule (docs/precision-study.md): held-out accuracy within 1
# point and final loss within 2% of bf16 on every model.
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

if [ "${STUDY:-}" = int8 ]; then
    C=${NL_MODEL_CACHE:-$HOME/.cache/nightlora}
    syn="$OUT/qwen35-$PRESET-q8_0.gguf"
    MODELS=${MODELS:-"$C/SmolLM2-135M-Instruct.Q4_1.gguf $C/gemma-3-270m-q4_k_m.gguf $syn"}
    INT8_EPOCHS=${INT8_EPOCHS:-1}
    R8="$OUT/int8.md"
    {
        echo "| model | compute | steps | train s | loss first → last | held-out accuracy | held-out loss |"
        echo "|---|---|---|---|---|---|---|"
    } >"$R8"
    for model in $MODELS; do
        name=$(basename "$model" .gguf)
        ep=$INT8_EPOCHS
        if [ "$model" = "$syn" ]; then
            "$BIN" mkmodel --arch qwen35 --preset "$PRESET" --type q8_0 --seed "$SEED" --out "$syn" >/dev/null
            ep=$EPOCHS
        fi
        for c in bf16 int8; do
            echo "== $name, $c: training ($ep epochs)" >&2
            fl="--backend host --threads $THREADS --precision keep --compute $c"
            log="$OUT/$name-$c.train"
            t0=$(date +%s.%N)
            # shellcheck disable=SC2086
            $RUN "$BIN" train --model "$model" --data "$TRAIN" --out "$OUT/$name-$c.gguf" $fl --batch-tokens "$BATCH" \
                --seed "$SEED" --epochs "$ep" --lr "$LR" --warmup 5 --log-json "$log.jsonl" >"$log" 2>&1 || { cat "$log" >&2; exit 1; }
            t1=$(date +%s.%N)
            set -- $(sed -n 's/^done after \([0-9]*\)\/[0-9]* steps: loss \([0-9.]*\) -> \([0-9.]*\).*/\1 \2 \3/p' "$log")
            steps=$1 l0=$2 l1=$3
            # shellcheck disable=SC2086
            $RUN "$BIN" eval --model "$model" --adapter "$OUT/$name-$c.gguf" --data "$TEST" $fl >"$OUT/$name-$c.eval" 2>&1 ||
                { cat "$OUT/$name-$c.eval" >&2; exit 1; }
            r=$(sed -n 's/.*loss \([0-9.]*\), ppl.*accuracy \([0-9.]*%\) (\([0-9]*\/[0-9]*\)).*/\2 (\3)|\1/p' "$OUT/$name-$c.eval" | tail -1)
            printf '| %s | %s | %s | %.0f | %s → %s | %s | %s |\n' "$name" "$c" "$steps" "$(echo "$t1 - $t0" | bc)" "$l0" "$l1" \
                "${r%%|*}" "${r##*|}" >>"$R8"
        done
    done
    {
        echo
        echo "Machine: $(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo 2>/dev/null | head -1), $(nproc) CPUs, --threads $THREADS;" \
            "nightlora $(git rev-parse --short HEAD 2>/dev/null || echo '?'); $(date -u +%Y-%m-%d)."
        echo "Settings: --precision keep; train --epochs $INT8_EPOCHS (synthetic: $EPOCHS) --lr $LR --warmup 5" \
            "--batch-tokens $BATCH --seed $SEED (rank 16, alpha 32, dropout 0.05, every projection)."
    } >>"$R8"
    cat "$R8"
    exit 0
fi

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
