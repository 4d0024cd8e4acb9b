#!/bin/sh
# make demo: the main job on the shipped default. A `small` synthetic Qwen3-shaped model (random
# weights, made by mkmodel) learns the example personal task in examples/: tagging short notes
# from a phone's inbox as work / family / shopping / travel / health.
set -e
BIN=${1:-build/nightlora}
OUT=${DEMO_OUT:-out/demo}
mkdir -p "$OUT"
rm -rf "$OUT/checkpoints"
echo "== 1. a small model (qwen3 shape, Q8_0 weights, random init)"
"$BIN" mkmodel --arch qwen3 --preset small --type q8_0 --seed 1 --out "$OUT/small.gguf"
echo
echo "== 2. held-out accuracy before training"
"$BIN" eval --model "$OUT/small.gguf" --data examples/tagging-test.jsonl --backend host --threads 2
echo
echo "== 3. LoRA training (rank 16, every projection; commits in $OUT/checkpoints; the held-out notes scored every 81 steps and at the end)"
"$BIN" train --model "$OUT/small.gguf" --data examples/tagging-train.jsonl --out "$OUT/adapter.gguf" \
    --backend host --threads 2 --epochs 3 --batch-tokens 256 --lr 2e-3 --warmup 5 \
    --val-data examples/tagging-test.jsonl --eval-every 81 \
    --checkpoint-dir "$OUT/checkpoints" --commit-every 20 --log-json "$OUT/train-log.jsonl" --report "$OUT/report.html" 2>&1 |
    awk '/^step/ { n++; if (n % 20 != 1) next } { print; fflush() }'
echo
echo "== 4. held-out accuracy after training, with the adapter"
"$BIN" eval --model "$OUT/small.gguf" --adapter "$OUT/adapter.gguf" --data examples/tagging-test.jsonl --backend host --threads 2
echo
echo "== 5. the adapter at work"
"$BIN" generate --model "$OUT/small.gguf" --adapter "$OUT/adapter.gguf" --raw --n 8 \
    --prompt "Note: Book the hotel for Friday
Tag:"
echo
echo "adapter (llama.cpp LoRA GGUF): $OUT/adapter.gguf   per-step log: $OUT/train-log.jsonl   report: $OUT/report.html"
