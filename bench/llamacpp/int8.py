#!/usr/bin/env python3
"""bench/llamacpp/int8.py: how close nightlora's `--compute int8` logits come to llama.cpp's CPU
logits on the same GGUF file (as stored: --precision keep), beside the bf16 (or f32) path.

  int8.py NIGHTLORA MODEL.gguf "t0 t1 ..." [MODE ...]   (run under the venv: bench/llamacpp/env.sh)

For every prompt position, the relative L2 difference of the logit rows ||z - z_llama|| / ||z_llama||;
prints the median and the largest over the positions and the last row's top-1 agreement, one line
per mode (default modes: int8 bf16 f32)."""
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import no_amx  # noqa: F401,E402
from llama_cpp import Llama  # noqa: E402


def ours(bin_, model, toks, mode, n_tok):
    with tempfile.NamedTemporaryFile(suffix=".f32") as f:
        subprocess.run([bin_, "logits", "--model", model, "--tokens", toks, "--out", f.name, "--backend", "host",
                        "--precision", "keep", "--compute", mode, "--threads", "2"], check=True, capture_output=True)
        data = open(f.name, "rb").read()
    V = len(data) // 4 // n_tok
    return np.frombuffer(data, dtype=np.float32).reshape(n_tok, V).astype(np.float64)


def main():
    bin_, model, toks = sys.argv[1:4]
    modes = sys.argv[4:] or ["int8", "bf16", "f32"]
    ids = [int(t) for t in toks.split()]
    llm = Llama(model_path=model, n_ctx=256, n_batch=256, n_threads=2, logits_all=True, verbose=False)
    llm.eval(ids)
    ref = np.asarray(llm.scores[: len(ids)], dtype=np.float64)
    for mode in modes:
        try:
            z = ours(bin_, model, toks, mode, len(ids))
        except subprocess.CalledProcessError as e:
            print(f"  {mode:5s}: nightlora failed: {e.stderr.decode(errors='replace').strip().splitlines()[-1:]}")
            continue
        rel = np.linalg.norm(z - ref, axis=1) / np.linalg.norm(ref, axis=1)
        top = "same" if int(np.argmax(z[-1])) == int(np.argmax(ref[-1])) else "differs"
        print(f"  {mode:5s}: logits vs llama.cpp rel L2 median {np.median(rel):.2e} max {rel.max():.2e}; "
              f"max |dz| {np.abs(z - ref).max():.3e}; last top-1 {top}")


if __name__ == "__main__":
    main()
