#!/bin/sh
# nightlora against its peers on the real model (SmolLM2-135M-Instruct, Q4_1 GGUF from
# tools/fetch-models.sh), one run, one table: the held-out tagging task through the model's own
# chat template (examples/tagging-chat-*.jsonl), base accuracy and accuracy after LoRA;
# transformers + PEFT on the CPU with the same weights, data, rank/alpha/targets/lr/steps/seed
# (accuracy and training tokens/s of both); llama.cpp (llama-cpp-python) with nightlora's adapter
# and with the merged model (next-token agreement, accuracy). bench/peers/compare.py has the details.
#
#   sh bench/peers_compare.sh            # installs llama-cpp-python, torch, transformers, peft once
#
# Environment: BIN (build/nightlora), WORK (/tmp/nightlora-peers), STEPS (44: one epoch of the
# 440 training lines at 512 tokens a step), THREADS (2), LR (1e-3), NO_PEFT (1 skips PEFT),
# NL_MODEL_CACHE. Exits 0 with a message when the model or a package cannot be had.
set -e
BIN=${BIN:-build/nightlora}
WORK=${WORK:-/tmp/nightlora-peers}
STEPS=${STEPS:-44}
THREADS=${THREADS:-2}
LR=${LR:-1e-3}
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(dirname "$HERE")
. "$HERE/llamacpp/env.sh"
if ! msg=$(sh "$ROOT/tools/fetch-models.sh" --check); then
    echo "peers_compare: skipped: $msg"
    exit 0
fi
if ! nl_need_llamacpp; then
    echo "peers_compare: llama-cpp-python cannot be had: skipping"
    exit 0
fi
peft=
if [ "${NO_PEFT:-0}" = 1 ]; then
    peft=--no-peft
elif ! nl_need_torch; then
    echo "peers_compare: torch/transformers/peft cannot be had: PEFT skipped"
    peft=--no-peft
fi
mkdir -p "$WORK"
exec "$NL_PY" "$HERE/peers/compare.py" --bin "$BIN" --model "$NL_MODEL_CACHE/SmolLM2-135M-Instruct.Q4_1.gguf" \
    --train "$ROOT/examples/tagging-chat-train.jsonl" --test "$ROOT/examples/tagging-chat-test.jsonl" \
    --work "$WORK" --steps "$STEPS" --threads "$THREADS" --lr "$LR" $peft
