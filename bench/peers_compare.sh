#!/bin/sh
# nightlora against its peers on a real model from tools/fetch-models.sh (SmolLM2-135M-Instruct,
# Q4_1, the default; or Gemma 3 270M, Q4_K_M), one run, one table: the held-out tagging task
# (SmolLM2: through the model's own chat template, examples/tagging-chat-*.jsonl; Gemma 3, a base
# model whose file has no chat template: prompt/completion, examples/tagging-*.jsonl), base
# accuracy and accuracy after LoRA;
# transformers + PEFT on the CPU with the same weights, data, rank/alpha/targets/lr/steps/seed
# (accuracy and training tokens/s of both); llama.cpp (llama-cpp-python) with nightlora's adapter
# and with the merged model (next-token agreement, accuracy). bench/peers/compare.py has the details.
#
#   sh bench/peers_compare.sh [smollm2|gemma3]   # installs llama-cpp-python, torch, transformers, peft once
#
# Environment: BIN (build/nightlora), WORK (/tmp/nightlora-peers[-gemma3]), STEPS (SmolLM2 44, Gemma 3
# 13: one epoch of the 440 training lines at 512 tokens a step), THREADS (2), LR (1e-3), NO_PEFT (1
# skips PEFT), NO_PEFT_FP32 (1 skips the slow FP32 per-sequence PEFT run: only the BF16 padded one,
# the speed figure), NO_LLAMACPP (1 skips llama.cpp and merge), NL_MODEL_CACHE. Exits 0 with a message when the model or a package cannot be had.
set -e
case "${1:-smollm2}" in
smollm2)
    target=smollm2 fetch= model=SmolLM2-135M-Instruct.Q4_1.gguf data=tagging-chat steps=44 work=/tmp/nightlora-peers ;;
gemma3)
    target=gemma3 fetch=gemma3 model=gemma-3-270m-q4_k_m.gguf data=tagging steps=13 work=/tmp/nightlora-peers-gemma3 ;;
*)
    echo "usage: sh bench/peers_compare.sh [smollm2|gemma3]" >&2
    exit 2 ;;
esac
BIN=${BIN:-build/nightlora}
WORK=${WORK:-$work}
STEPS=${STEPS:-$steps}
THREADS=${THREADS:-2}
LR=${LR:-1e-3}
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(dirname "$HERE")
. "$HERE/llamacpp/env.sh"
if ! msg=$(sh "$ROOT/tools/fetch-models.sh" --check $fetch 2>&1); then
    echo "peers_compare: $target skipped: $msg"
    exit 0
fi
ll=
if [ "${NO_LLAMACPP:-0}" = 1 ]; then
    ll=--no-llamacpp
elif ! nl_need_llamacpp; then
    echo "peers_compare: llama-cpp-python cannot be had: skipping"
    exit 0
fi
peft=
[ "${NO_PEFT_FP32:-0}" = 1 ] && peft=--no-peft-fp32
if [ "${NO_PEFT:-0}" = 1 ]; then
    peft=--no-peft
elif ! nl_need_torch; then
    echo "peers_compare: torch/transformers/peft cannot be had: PEFT skipped"
    peft=--no-peft
fi
mkdir -p "$WORK"
exec "$NL_PY" "$HERE/peers/compare.py" --bin "$BIN" --model "$NL_MODEL_CACHE/$model" \
    --train "$ROOT/examples/$data-train.jsonl" --test "$ROOT/examples/$data-test.jsonl" \
    --work "$WORK" --steps "$STEPS" --threads "$THREADS" --lr "$LR" $peft $ll
