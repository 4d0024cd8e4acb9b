#!/bin/sh
# Merge keeps what was learned, on the real model: a short LoRA run on the example tagging chat
# data with SmolLM2-135M-Instruct (Q4_1), then the held-out accuracy of base + adapter against the
# merged model's as merge writes it by default (the adapted Q4_1 weights as Q8_0): within 2
# points, and merge's summary line says it kept the update. `merge --type q4_1` is shown beside
# (it loses the update: merge warns, --strict refuses and writes nothing). Exit 77 (skipped) when
# the model is not in ${NL_MODEL_CACHE:-$HOME/.cache/nightlora} (tools/fetch-models.sh puts it
# there). Run by .ci/run (3.5 min of CPU, 7 min wall on 2 shared cores: too long for make test).
# Usage: sh tests/merge_real.sh [build/nightlora]
set -eu
NL=${1:-build/nightlora}
M=${NL_MODEL_CACHE:-$HOME/.cache/nightlora}/SmolLM2-135M-Instruct.Q4_1.gguf
if [ ! -f "$M" ]; then echo "merge_real: $M not found: skipped"; exit 77; fi
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
TEST=examples/tagging-chat-test.jsonl
"$NL" train --model "$M" --data examples/tagging-chat-train.jsonl --out "$d/a.gguf" --rank 16 --alpha 32 --lr 1e-3 \
    --warmup 2 --steps ${MERGE_REAL_STEPS:-10} --batch-tokens 512 --quiet
acc() { "$NL" eval --model "$@" --data "$TEST" --json | python3 -c 'import json, sys; print(round(100 * json.load(sys.stdin)["accuracy"], 1))'; }
a=$(acc "$M" --adapter "$d/a.gguf")
"$NL" merge --model "$M" --adapter "$d/a.gguf" --out "$d/merged.gguf" 2>"$d/merge.err"
cat "$d/merge.err"
grep -q "kept" "$d/merge.err"
if grep -q "warning" "$d/merge.err"; then echo "merge_real: the default merge warned"; exit 1; fi
"$NL" check --model "$d/merged.gguf" >/dev/null
mg=$(acc "$d/merged.gguf")
"$NL" merge --model "$M" --adapter "$d/a.gguf" --out "$d/merged-q4_1.gguf" --type q4_1 2>"$d/q4.err" || { cat "$d/q4.err"; exit 1; }
cat "$d/q4.err"
grep -q "warning" "$d/q4.err" || { echo "merge_real: --type q4_1 did not warn"; exit 1; }
q4=$(acc "$d/merged-q4_1.gguf")
if "$NL" merge --model "$M" --adapter "$d/a.gguf" --out "$d/strict.gguf" --type q4_1 --strict 2>"$d/strict.err"; then
  echo "merge_real: --strict --type q4_1 wrote a model"; exit 1
fi
[ ! -e "$d/strict.gguf" ] || { echo "merge_real: --strict left $d/strict.gguf"; exit 1; }
cat "$d/strict.err"
echo "merge_real: held-out accuracy: base + adapter $a%, merged (default) $mg%, merged --type q4_1 $q4%"
python3 -c "import sys; a, m = float(sys.argv[1]), float(sys.argv[2]); sys.exit(0 if abs(a - m) <= 2.0 else 1)" "$a" "$mg" ||
  { echo "merge_real: the merged model's accuracy is more than 2 points from the adapter's"; exit 1; }
echo "merge_real: ok"
