#!/bin/sh
# Does llama.cpp load what nightlora writes, and compute the same thing? For each architecture:
# a `small` synthetic model written by `nightlora mkmodel` (F32 weights; and a Q8_0 one), a LoRA
# adapter trained on it by `nightlora train` (a short run on the example tagging task), then
# llama.cpp — node-llama-cpp's prebuilt CPU build, from the npm registry — gives the next-token
# probabilities after a fixed token prompt, with and without the adapter, and
# bench/llamacpp/compare.py compares them with nightlora's (`logits`, ref backend, FP32).
#
#   sh bench/llamacpp_check.sh          # needs node and npm; installs into $WORK once
#
# Environment: BIN (build/nightlora), WORK (/tmp/nightlora-llamacpp), ARCHS ("llama qwen3 qwen35"),
# STEPS (120). Exit status 1 if llama.cpp refuses a file or an F32 model's top token differs
# (the Q8_0 rows are reported only: llama.cpp rounds activations to 8 bits there, so a near tie
# among the top tokens of these nearly flat distributions may go either way). When node, npm or
# the package cannot be had, it says so and exits 0.
set -e
BIN=${BIN:-build/nightlora}
WORK=${WORK:-/tmp/nightlora-llamacpp}
ARCHS=${ARCHS:-"llama qwen3 qwen35"}
STEPS=${STEPS:-120}
NLC_VERSION=3.22.1
HERE=$(cd "$(dirname "$0")" && pwd)
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
    echo "llamacpp_check: node/npm not found: skipping"
    exit 0
fi
case "$(uname -m)" in
x86_64) PLAT=linux-x64 ;;
aarch64) PLAT=linux-arm64 ;;
*) echo "llamacpp_check: no prebuilt llama.cpp for $(uname -m): skipping"; exit 0 ;;
esac
mkdir -p "$WORK"
if [ ! -d "$WORK/node_modules/node-llama-cpp" ]; then
    echo "installing node-llama-cpp $NLC_VERSION ($PLAT) into $WORK ..."
    [ -f "$WORK/package.json" ] || echo '{"private": true}' >"$WORK/package.json"
    if ! (cd "$WORK" && npm install --no-audit --no-fund --omit=optional "node-llama-cpp@$NLC_VERSION" \
        "@node-llama-cpp/$PLAT@$NLC_VERSION" >"$WORK/npm.log" 2>&1); then
        tail -5 "$WORK/npm.log"
        echo "llamacpp_check: cannot install node-llama-cpp from the npm registry: skipping"
        exit 0
    fi
fi
cp "$HERE/llamacpp/probs.mjs" "$WORK/probs.mjs"
# can this machine run the prebuilt llama.cpp at all? (an environment problem is a skip, not a
# verdict on nightlora's files)
if ! (cd "$WORK" && node -e "import('node-llama-cpp').then(m => m.getLlama({gpu: false, build: 'never'}))" \
    >"$WORK/preflight.log" 2>&1); then
    tail -5 "$WORK/preflight.log"
    echo "llamacpp_check: the prebuilt llama.cpp does not start on this machine: skipping"
    exit 0
fi
TOKS="1 500 77 1200 9 3000 41 2 2222 345"
status=0
check() { # label model fatal [adapter]
    label=$1
    model=$2
    fatal=$3
    ad=$4
    out="$WORK/$(echo "$label" | tr ' ' '_').json"
    if ! node "$WORK/probs.mjs" "$model" "$TOKS" "$out" $ad >"$WORK/node.log" 2>&1; then
        echo "$label: llama.cpp failed:"
        tail -5 "$WORK/node.log"
        status=1
        return
    fi
    printf '%-22s ' "$label:"
    rc=0
    if [ -n "$ad" ]; then
        python3 "$HERE/llamacpp/compare.py" "$BIN" "$model" "$TOKS" "$out" --adapter "$ad" || rc=$?
    else
        python3 "$HERE/llamacpp/compare.py" "$BIN" "$model" "$TOKS" "$out" || rc=$?
    fi
    [ "$rc" -eq 0 ] || [ "$fatal" = 0 ] || status=1
}
for arch in $ARCHS; do
    m="$WORK/$arch-small.gguf"
    mq="$WORK/$arch-small-q8_0.gguf"
    a="$WORK/$arch-adapter.gguf"
    "$BIN" mkmodel --arch "$arch" --preset small --type f32 --seed 1 --out "$m" >/dev/null
    "$BIN" mkmodel --arch "$arch" --preset small --type q8_0 --seed 1 --out "$mq" >/dev/null
    "$BIN" train --model "$m" --data examples/tagging-train.jsonl --out "$a" --steps "$STEPS" --lr 2e-3 \
        --batch-tokens 256 --backend host --threads 2 --seed 1 --quiet >/dev/null
    check "$arch f32" "$m" 1
    check "$arch f32 + adapter" "$m" 1 "$a"
    check "$arch q8_0" "$mq" 0
    check "$arch q8_0 + adapter" "$mq" 0 "$a"
done
[ "$status" -eq 0 ] && echo "llamacpp_check: llama.cpp loaded every model and adapter; F32 top tokens agree"
exit $status
