#!/bin/sh
# nightlora's PEFT adapters against Hugging Face PEFT on the real model, SmolLM2-135M-Instruct
# (Q4_1 GGUF from tools/fetch-models.sh): an adapter nightlora trained and exported
# (`nightlora export --format peft`) loads in PEFT on the same base with the same logits, and an
# adapter PEFT made and saved reads in nightlora (`--adapter DIR`) with the same logits and eval
# loss; bench/peft_check.py has the details and the tolerances.
#
#   sh bench/peft_check.sh            # installs torch, transformers, peft (and gguf) once
#
# Environment: BIN (build/nightlora), WORK (/tmp/nightlora-peft), STEPS (4), THREADS (2),
# NL_MODEL_CACHE. Exits 0 with a message when the model or a package cannot be had; 1 when a
# check fails.
set -e
BIN=${BIN:-build/nightlora}
WORK=${WORK:-/tmp/nightlora-peft}
STEPS=${STEPS:-4}
THREADS=${THREADS:-2}
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(dirname "$HERE")
. "$HERE/llamacpp/env.sh"
if ! msg=$(sh "$ROOT/tools/fetch-models.sh" --check); then
    echo "peft_check: skipped: $msg"
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
exec nice -n 10 "$NL_PY" "$HERE/peft_check.py" --bin "$BIN" --model "$NL_MODEL_CACHE/SmolLM2-135M-Instruct.Q4_1.gguf" \
    --data "$ROOT/examples/tagging-chat-train.jsonl" --work "$WORK" --steps "$STEPS" --threads "$THREADS"
