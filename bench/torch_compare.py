#!/usr/bin/env python3
"""bench/torch_compare.py: one LoRA training step (forward + loss + backward) of the qwen3-0.6b
shape in PyTorch (FP32, then BF16 unless --no-bf16; each with the explicit attention and with
F.scaled_dot_product_attention, the faster one the peer; each configuration in its own process,
so its peak RSS is its own) and in nightlora, one after the other, and the ratios (tokens/s and
peak RSS).

The PyTorch is today's: PyPI's torch 2.x in the project's venv (bench/llamacpp/env.sh; the
script re-runs itself under the venv's Python); --python-as-is uses the Python it was started
with instead (e.g. Debian's torch 1.13, only where asked).

Shape: 28 layers, n_embd 1024, n_ff 3072, 16 query heads / 8 kv heads of 128, q/k RMSNorm,
RoPE (neox), vocabulary 151936 (tied head); LoRA rank 16 (alpha 32) on q, k, v, o, gate, up,
down of every layer; T tokens, batch 1, every row a target. Frozen weights are random (the
timing does not depend on their values). PyTorch runs with torch.set_num_threads(THREADS) and
OMP_WAIT_POLICY=PASSIVE (set before torch is imported), so idle OpenMP threads do not spin on
the cores nightlora needs later.

nightlora runs `bench step --only c` (synchronous: what `train --overlap auto` runs when the
projection service computes on the CPU cores, as the host backend does) twice: the FP32 path
(--precision f32 --compute f32) and the default path (Q8_0 resident, bf16 compute and BF16
attention where the CPU has AVX512_BF16). --config d times the overlapped path instead.

Usage: bench/torch_compare.py --nightlora build/nightlora [--model q06.gguf] [--tokens 512] [--config c|d]
                              [--threads 2] [--reps 3] [--bench-cmd "bench step"] [--no-bf16] [--python-as-is]
Without PyTorch the script says so and exits 0 (nothing to compare).
"""
import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def torch_step_seconds(T, threads, reps, dtype="fp32", attn="explicit"):
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    DT = torch.bfloat16 if dtype == "bf16" else torch.float32  # bf16: weights, LoRA and activations
    E, FF, H, HKV, HD, L, V, R, ALPHA = 1024, 3072, 16, 8, 128, 28, 151936, 16, 32.0
    eps, base = 1e-6, 1000000.0
    s = ALPHA / R

    def frozen(n_out, n_in):
        return (torch.randn(n_out, n_in) * (1.0 / n_in ** 0.5)).to(DT).requires_grad_(False)

    class Lora(torch.nn.Module):
        def __init__(self, n_in, n_out):
            super().__init__()
            self.w = frozen(n_out, n_in)
            self.a = torch.nn.Parameter(torch.empty(R, n_in).uniform_(-1 / n_in ** 0.5, 1 / n_in ** 0.5).to(DT))
            self.b = torch.nn.Parameter((torch.randn(n_out, R) * 1e-3).to(DT))

        def forward(self, x):
            return F.linear(x, self.w) + s * F.linear(F.linear(x, self.a), self.b)

    def rms(x, w):
        return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))

    inv = base ** (-torch.arange(0, HD, 2, dtype=torch.float64) / HD)
    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv[None, :]
    cos, sin = torch.cos(ang).to(DT), torch.sin(ang).to(DT)  # [T][HD/2]

    def rope(x):  # x [T][heads][HD], neox pairs (i, i + HD/2)
        a, b = x[..., : HD // 2], x[..., HD // 2:]
        c, n = cos[:, None, :], sin[:, None, :]
        return torch.cat([a * c - b * n, a * n + b * c], dim=-1)

    layers = []
    for _ in range(L):
        layers.append(dict(q=Lora(E, H * HD), k=Lora(E, HKV * HD), v=Lora(E, HKV * HD), o=Lora(H * HD, E),
                           gate=Lora(E, FF), up=Lora(E, FF), down=Lora(FF, E),
                           n1=torch.ones(E, dtype=DT), n2=torch.ones(E, dtype=DT), qn=torch.ones(HD, dtype=DT),
                           kn=torch.ones(HD, dtype=DT)))
    emb = frozen(V, E)
    out_norm = torch.ones(E, dtype=DT)
    mask = torch.full((T, T), float("-inf")).triu(1).to(DT)
    tokens = torch.randint(0, V, (T + 1,))
    params = [p for ly in layers for k in ("q", "k", "v", "o", "gate", "up", "down") for p in ly[k].parameters()]

    def step():
        for p in params:
            p.grad = None
        x = emb[tokens[:T]]
        for ly in layers:
            h = rms(x, ly["n1"])
            q = rms(ly["q"](h).view(T, H, HD), ly["qn"])
            k = rms(ly["k"](h).view(T, HKV, HD), ly["kn"])
            v = ly["v"](h).view(T, HKV, HD)
            q, k = rope(q), rope(k)
            k = k.repeat_interleave(H // HKV, dim=1)
            v = v.repeat_interleave(H // HKV, dim=1)
            if attn == "sdpa":
                o = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None],
                                                   v.transpose(0, 1)[None], is_causal=True)
                o = o[0].transpose(0, 1).reshape(T, H * HD)
            else:
                att = torch.einsum("thd,shd->hts", q, k) / HD ** 0.5 + mask
                o = torch.einsum("hts,shd->thd", att.softmax(-1), v).reshape(T, H * HD)
            x = x + ly["o"](o)
            h = rms(x, ly["n2"])
            x = x + ly["down"](F.silu(ly["gate"](h)) * ly["up"](h))
        logits = F.linear(rms(x, out_norm), emb)
        loss = F.cross_entropy(logits, tokens[1:])
        loss.backward()
        return float(loss)

    step()  # warm-up
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    times.sort()
    return times[(len(times) - 1) // 2], torch.__version__


def nightlora_step(bin_, cmd, model, T, threads, reps, extra, config):
    argv = [bin_] + shlex.split(cmd) + ["--model", model, "--tokens", str(T), "--threads", str(threads), "--reps", str(reps),
                                        "--warmup", "1", "--only", config, "--json"] + extra
    out = subprocess.run(argv, check=True, capture_output=True, text=True).stdout
    return json.loads(out)["configs"][config]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nightlora", default="build/nightlora")
    ap.add_argument("--bench-cmd", default="bench step", help='sub-command words (e.g. "bench-step")')
    ap.add_argument("--model", help="qwen3-0.6b GGUF (default: made with mkmodel --type q8_0 in a temp dir)")
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--config", choices=("c", "d"), default="c", help="bench step configuration (c: synchronous, d: overlapped)")
    ap.add_argument("--no-bf16", action="store_true", help="skip the PyTorch BF16 step")
    ap.add_argument("--python-as-is", action="store_true",
                    help="use this Python's torch (e.g. Debian's 1.13) instead of the project's venv (bench/llamacpp/env.sh)")
    ap.add_argument("--torch-only", nargs=2, metavar=("DTYPE", "ATTN"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.torch_only:  # one PyTorch configuration in its own process: its time and its own peak RSS
        import resource
        secs, ver = torch_step_seconds(a.tokens, a.threads, a.reps, a.torch_only[0], a.torch_only[1])
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        print(json.dumps({"seconds": secs, "version": ver, "peak_rss_bytes": rss}))
        return 0
    venv = os.environ.get("NL_VENV", os.path.join(os.environ.get("NL_MODEL_CACHE", os.path.expanduser("~/.cache/nightlora")), "venv"))
    venv_py = os.path.join(venv, "bin", "python")
    # in the venv or not is sys.prefix's question: the venv's python is a symlink to the base
    # interpreter, so the two executables' real paths can be the same file
    if not a.python_as_is and os.path.realpath(sys.prefix) != os.path.realpath(venv):
        if os.access(venv_py, os.X_OK):  # today's PyTorch: the project's venv
            os.execv(venv_py, [venv_py] + sys.argv)
        print(f"torch_compare: the project's venv ({venv_py}) is missing: make it with "
              "`. bench/llamacpp/env.sh && nl_need_torch`, or pass --python-as-is to use this Python's torch")
        return 0
    try:
        import torch  # noqa: F401
    except ImportError:
        print("torch_compare: PyTorch is not installed (python3 -c 'import torch' fails): nothing to compare, skipping")
        return 0

    def torch_run(dtype, attn):
        argv = [sys.executable, os.path.abspath(__file__), "--torch-only", dtype, attn, "--tokens", str(a.tokens),
                "--threads", str(a.threads), "--reps", str(a.reps), "--python-as-is"]
        r = subprocess.run(argv, capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(r.stderr.strip().splitlines()[-1] if r.stderr.strip() else f"exit {r.returncode}")
        return json.loads(r.stdout.strip().splitlines()[-1])

    # each precision with both attentions (SDPA was slower than the explicit one on some CPUs); the
    # faster is the peer
    best = {}
    for dtype in ("fp32",) + (() if a.no_bf16 else ("bf16",)):
        for attn in ("explicit", "sdpa"):
            try:
                r = torch_run(dtype, attn)
            except RuntimeError as e:  # an op without a BF16 CPU kernel in this PyTorch
                print(f"pytorch {dtype} {attn}: not run ({e})")
                continue
            print(f"pytorch {r['version']} {dtype} ({'weights, LoRA, activations' if dtype == 'bf16' else 'all FP32'}), "
                  f"{attn} attention, {a.threads} threads: {r['seconds']:.3f} s/step, {a.tokens / r['seconds']:.1f} "
                  f"tokens/s, peak RSS {r['peak_rss_bytes'] / 1e9:.2f} GB", flush=True)
            if dtype not in best or r["seconds"] < best[dtype]["seconds"]:
                best[dtype] = dict(r, attn=attn)
    if "fp32" not in best:
        print("torch_compare: no PyTorch step ran")
        return 1
    tps_torch = a.tokens / best["fp32"]["seconds"]
    tps_bf16 = a.tokens / best["bf16"]["seconds"] if "bf16" in best else None
    with tempfile.TemporaryDirectory() as tmp:
        model = a.model
        if not model:
            model = os.path.join(tmp, "q06.gguf")
            subprocess.run([a.nightlora, "mkmodel", "--arch", "qwen3", "--preset", "qwen3-0.6b", "--type", "q8_0", "--out", model],
                           check=True, capture_output=True)
        for label, extra in (("fp32 (--precision f32 --compute f32)", ["--precision", "f32", "--compute", "f32"]),
                             ("default (q8_0 resident, bf16 compute)", [])):
            r = nightlora_step(a.nightlora, a.bench_cmd, model, a.tokens, a.threads, a.reps, extra, a.config)
            print(f"nightlora {label}: {r['seconds_per_step']:.3f} s/step, {r['tokens_per_s']:.1f} tokens/s, "
                  f"peak RSS {r['peak_rss_bytes'] / 1e9:.2f} GB; ratio to pytorch fp32 ({best['fp32']['attn']}) "
                  f"{r['tokens_per_s'] / tps_torch:.2f}x, RSS {r['peak_rss_bytes'] / best['fp32']['peak_rss_bytes']:.2f}x"
                  + (f"; to pytorch bf16 ({best['bf16']['attn']}) {r['tokens_per_s'] / tps_bf16:.2f}x, RSS "
                     f"{r['peak_rss_bytes'] / best['bf16']['peak_rss_bytes']:.2f}x" if tps_bf16 else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
