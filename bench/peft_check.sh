#!/bin/sh
# nightlora's PEFT adapters against Hugging Face PEFT on a real model from tools/fetch-models.sh:
# SmolLM2-135M-Instruct (Q4_1, llama; the default) or Gemma 3 270M (Q4_K_M, gemma3): an adapter
# nightlora trained and exported (`nightlora export --format peft`) loads in PEFT on the same base
# with the same logits, and an adapter PEFT made and saved reads in nightlora (`--adapter DIR`)
# with the same logits and eval loss; the base model's FP32 logits equal transformers' FP32 forward;
# bench/peft_check.py has the details and the tolerances.
#
#   sh bench/peft_check.sh [smollm2|gemma3]   # installs torch, transformers, peft (and gguf) once
#
# Environment: BIN (build/nightlora), WORK (/tmp/nightlora-peft[-gemma3]), STEPS (4), THREADS (2),
# NL_MODEL_CACHE. Exits 0 with a message when the model or a package cannot be had; 1 when a
# check fails.
set -e
case "${1:-smollm2}" in
smollm2)
    # and the README's PEFT lines as printed (its export and AutoPeftModelForCausalLM load)
    target=smollm2 fetch= model=SmolLM2-135M-Instruct.Q4_1.gguf data=tagging-chat-train.jsonl work=/tmp/nightlora-peft readme=--readme ;;
gemma3)
    # a base model without a chat template: the prompt/completion form of the task
    target=gemma3 fetch=gemma3 model=gemma-3-270m-q4_k_m.gguf data=tagging-train.jsonl work=/tmp/nightlora-peft-gemma3 readme= ;;
*)
    echo "usage: sh bench/peft_check.sh [smollm2|gemma3]" >&2
    exit 2 ;;
esac
BIN=${BIN:-build/nightlora}
WORK=${WORK:-$work}
STEPS=${STEPS:-4}
THREADS=${THREADS:-2}
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(dirname "$HERE")
. "$HERE/llamacpp/env.sh"
if ! msg=$(sh "$ROOT/tools/fetch-models.sh" --check $fetch 2>&1); then
    echo "peft_check: $target skipped: $msg"
    exit 0
fi
if ! nl_need_torch; then
    echo "peft_check: torch/transformers/peft cannot be had: skipping"
    exit 0
fi
# transformers reads the GGUF through gguf-py
if ! "$NL_PY" -c "import gguf" 2>/dev/null &&
    ! "$NL_PY" -m pip install --quiet "gguf==$GGUF_PY_VERSION" >"$NL_MODEL_CACHE/gguf-install.log" 2>&1; then
    echo "peft_check: gguf $GGUF_PY_VERSION cannot be had: skipping"
    exit 0
fi
mkdir -p "$WORK"
exec nice -n 10 "$NL_PY" "$HERE/peft_check.py" --bin "$BIN" --model "$NL_MODEL_CACHE/$model" \
    --data "$ROOT/examples/$data" --work "$WORK" --steps "$STEPS" --threads "$THREADS" ${readme:+$readme "$ROOT/README.md"}
