#!/usr/bin/env python3
"""bench/llamacpp/compare.py: nightlora's next-token probabilities (`nightlora logits`, ref
backend, FP32 resident weights) against llama.cpp's top N (written by probs.py).

  compare.py NIGHTLORA MODEL.gguf "t0 t1 ..." LLAMACPP.json [--adapter A.gguf]

Prints one line: top-1 agreement, whether the top-N order is identical, and the largest relative
difference of the top-N probabilities. Exit status 1 when the top token differs."""
import json
import math
import struct
import subprocess
import sys
import tempfile


def main():
    bin_, model, toks, ref_path = sys.argv[1:5]
    extra = sys.argv[5:]
    n_tok = len(toks.split())
    with tempfile.NamedTemporaryFile(suffix=".f32") as f:
        subprocess.run([bin_, "logits", "--model", model, "--tokens", toks, "--out", f.name, "--backend", "ref",
                        "--precision", "f32"] + extra, check=True, capture_output=True)
        data = open(f.name, "rb").read()
    V = len(data) // 4 // n_tok
    last = struct.unpack_from(f"{V}f", data, (n_tok - 1) * V * 4)
    m = max(last)
    z = sum(math.exp(x - m) for x in last)
    p = [math.exp(x - m) / z for x in last]
    ref = json.load(open(ref_path))
    ours = sorted(range(V), key=lambda j: -p[j])[: len(ref)]
    theirs = [t for t, _ in ref]
    maxrel = max(abs(p[t] - q) / q for t, q in ref)
    print(f"top-1 nightlora {ours[0]} (p {p[ours[0]]:.6f}) llama.cpp {theirs[0]} (p {ref[0][1]:.6f}); "
          f"top-{len(ref)} order {'identical' if ours == theirs else 'differs'}; max rel diff of the top-{len(ref)} "
          f"probabilities {maxrel:.2e}")
    return 0 if ours[0] == theirs[0] else 1


if __name__ == "__main__":
    sys.exit(main())
