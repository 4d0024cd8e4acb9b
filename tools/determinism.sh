#!/bin/sh
# Determinism fingerprint: trains a short run on each architecture (tiny preset; gemma3's lines
# come after the other three's, which stay as they were) on the default
# path, the FP32 path and with recompute (--act-budget-mb 0), and prints the sha256 of every adapter and the
# per-step losses. Two builds that print the same lines produce the same bits.
#   sh tools/determinism.sh [build/nightlora] [OUTDIR]
# DET_MODES="f32" (a subset of "default f32 recompute") prints only those modes' lines, and the
# logits/eval lines only when default is among them (.ci/aarch64.sh's short run under qemu).
set -e
BIN=${1:-build/nightlora}
OUT=${2:-out/determinism}
MODES=${DET_MODES:-default f32 recompute}
mkdir -p "$OUT"
for arch in llama qwen3 qwen35 gemma3; do
  "$BIN" mkmodel --arch "$arch" --preset tiny --type q8_0 --seed 3 --out "$OUT/$arch.gguf" >/dev/null
  for mode in $MODES; do
    case $mode in
      default) extra="" ;;
      f32) extra="--precision f32 --compute f32" ;;
      recompute) extra="--act-budget-mb 0" ;;
    esac
    rm -f "$OUT/$arch-$mode.gguf" "$OUT/$arch-$mode.jsonl"
    # shellcheck disable=SC2086
    "$BIN" train --model "$OUT/$arch.gguf" --data examples/tagging-train.jsonl \
      --out "$OUT/$arch-$mode.gguf" --backend host --threads 2 --steps 12 --batch-tokens 256 \
      --lr 2e-3 --warmup 2 --seed 7 --log-json "$OUT/$arch-$mode.jsonl" --quiet $extra >/dev/null 2>&1
    h=$(sha256sum "$OUT/$arch-$mode.gguf" | cut -c1-16)
    losses=$(grep -o '"loss":[^,}]*' "$OUT/$arch-$mode.jsonl" | cut -d: -f2 | tr '\n' ' ')
    echo "$arch $mode adapter $h losses $losses"
  done
  case " $MODES " in *" default "*) ;; *) continue ;; esac
  # inference: logits and eval with the default path's adapter (the no-gradient path), at the
  # training policy's resident types (--precision auto: the fingerprint predates the inference
  # commands' default of the stored types, and stays comparable)
  "$BIN" logits --model "$OUT/$arch.gguf" --adapter "$OUT/$arch-default.gguf" --backend host --threads 2 --precision auto \
    --tokens "1 5 9 200 31 7 64 3 11 90 2 17" --out "$OUT/$arch-logits.f32" >/dev/null 2>&1
  echo "$arch logits $(sha256sum "$OUT/$arch-logits.f32" | cut -c1-16)"
  echo "$arch eval $("$BIN" eval --model "$OUT/$arch.gguf" --adapter "$OUT/$arch-default.gguf" \
    --data examples/tagging-test.jsonl --backend host --threads 2 --precision auto 2>/dev/null | sed 's/.*: //')"
done
