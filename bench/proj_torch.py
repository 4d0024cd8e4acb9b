#!/usr/bin/env python3
"""bench/proj_torch.py: `nightlora bench proj` beside PyTorch BF16 linear on the same shapes, in
the same run, and the ratios.

nightlora runs first (`bench proj --json` on the model: every distinct projection shape and
resident type, both directions, at each T; the host backend with the compute mode a run would
use, or --compute; on a CPU with usable AMX also the tile kernels, in their own columns). Then
PyTorch times, for each (K, N) of those rows, in BF16 with torch.set_num_threads(THREADS):
    FWD  F.linear(x, W)   x: T x K, W: N x K      (what the service's NL_FWD computes)
    BWD  dy @ W           dy: T x N               (NL_BWD, the input gradient)
best of --reps after one warm-up; FLOPs of one product = 2·T·N·K. OMP_WAIT_POLICY=PASSIVE is
set before torch is imported (idle OpenMP threads do not spin on nightlora's cores).

Usage: bench/proj_torch.py --nightlora build/nightlora --model M.gguf [--tokens 512] [--threads 2]
                           [--reps 3] [--compute auto|f32|bf16|amx] [--json OUT.json]
Without PyTorch the script prints nightlora's rows, says so and exits 0 (nothing to compare).
"""
import argparse
import json
import os
import subprocess
import sys
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def nightlora_rows(args):
    cmd = [args.nightlora, "bench", "proj", "--model", args.model, "--tokens", args.tokens, "--threads",
           str(args.threads), "--reps", str(args.reps), "--json"]
    if args.compute:
        cmd += ["--compute", args.compute]
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout
    return json.loads(out)


def torch_seconds(torch, T, K, N, d, reps):
    import torch.nn.functional as F
    g = torch.Generator().manual_seed(0)
    W = torch.randn(N, K, generator=g).to(torch.bfloat16)
    x = torch.randn(T, N if d == "bwd" else K, generator=g).to(torch.bfloat16)
    f = (lambda: x @ W) if d == "bwd" else (lambda: F.linear(x, W))
    with torch.no_grad():
        f()  # warm-up
        best = float("inf")
        for _ in range(reps):
            t0 = time.perf_counter()
            f()
            best = min(best, time.perf_counter() - t0)
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nightlora", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokens", default="512")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--compute", default=None)
    ap.add_argument("--json", default=None, help="write the joined rows here")
    args = ap.parse_args()

    rows = nightlora_rows(args)
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None:
        torch.set_num_threads(args.threads)
    has_amx = any("amx_gflops" in r for r in rows)
    hdr = "%-14s %12s %-5s %-3s %5s %-8s %10s" % ("proj", "K x N", "type", "dir", "T", "compute", "host GF/s")
    if has_amx:
        hdr += " %10s" % "amx GF/s"
    hdr += " %10s %8s" % ("torch GF/s", "ratio")
    print("nightlora %s vs PyTorch %s BF16 linear, %d thread%s, best of %d" %
          (args.nightlora, torch.__version__ if torch else "(not installed)", args.threads,
           "" if args.threads == 1 else "s", args.reps))
    print(hdr)
    for r in rows:
        K, N, T, d = r["k"], r["n"], r["T"], r["dir"]
        flops = 2.0 * T * N * K
        line = "%-14s %12s %-5s %-3s %5d %-8s %10.1f" % (r["proj"], "%dx%d" % (K, N), r["type"], d, T, r["compute"],
                                                         r["host_gflops"])
        best = r["host_gflops"]
        if has_amx:
            a = r.get("amx_gflops")
            line += " %10s" % ("%.1f" % a if a is not None else "-")
            if a is not None and a > best:
                best = a
        if torch is not None:
            ts = torch_seconds(torch, T, K, N, d, args.reps)
            r["torch_gflops"] = flops / ts * 1e-9
            line += " %10.1f %7.2fx" % (r["torch_gflops"], best / r["torch_gflops"])
        else:
            line += " %10s %8s" % ("-", "-")
        print(line, flush=True)
    if torch is None:
        print("PyTorch is not installed here: nightlora's rows only, nothing to compare")
    else:
        print("ratio = nightlora's faster kernels (host%s) / PyTorch BF16, GFLOP/s" % (" or amx" if has_amx else ""))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
