#!/usr/bin/env python3
"""bench/llamacpp/probs.py: llama.cpp's next-token probabilities after a token prompt, through
llama-cpp-python (the real llama.cpp, built from its PyPI sdist; CPU). Writes the top N as JSON
[[token, p], ...], the softmax of the last row's logits.

  probs.py MODEL.gguf "t0 t1 ..." OUT.json [ADAPTER.gguf] [N]

The adapter goes through llama.cpp's own LoRA loader (Llama(lora_path=...), scale 1)."""
import json
import sys

import numpy as np

import no_amx  # noqa: F401  (before any Llama: AMX CPUs use llama.cpp's plain CPU path)
from llama_cpp import Llama


def main():
    model, toks, out = sys.argv[1:4]
    lora = sys.argv[4] if len(sys.argv) > 4 and sys.argv[4] else None
    top_n = int(sys.argv[5]) if len(sys.argv) > 5 else 10
    ids = [int(t) for t in toks.split()]
    llm = Llama(model_path=model, n_ctx=256, n_batch=256, n_threads=2, lora_path=lora, logits_all=True, verbose=False)
    llm.eval(ids)
    z = np.asarray(llm.scores[len(ids) - 1], dtype=np.float64)
    p = np.exp(z - z.max())
    p /= p.sum()
    top = np.argsort(-p, kind="stable")[:top_n]
    with open(out, "w") as f:
        json.dump([[int(t), float(p[t])] for t in top], f)


if __name__ == "__main__":
    main()
