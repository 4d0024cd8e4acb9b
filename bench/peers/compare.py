#!/usr/bin/env python3
"""bench/peers/compare.py: nightlora and its peers on a real model, one run, one table (driven by
bench/peers_compare.sh, which also sets up the environment).

  compare.py --bin build/nightlora --model M.gguf --train T.jsonl --test E.jsonl --work DIR
             [--rank 16 --alpha 32 --lr 1e-3 --warmup 5 --steps N --batch-tokens 512 --seed 1 --threads 2]
             [--no-peft] [--no-peft-bf16] [--no-peft-fp32] [--no-llamacpp]

The same weights (the GGUF), data (the JSONL files), rank/alpha/targets/lr/schedule/steps/seed:
  nightlora       `eval` of the base, `train --no-shuffle --log-json`, `eval --adapter`
  PEFT            bench/peers/peft_lora.py: transformers + PEFT on the CPU, base from the same GGUF;
                  twice: FP32 one sequence at a time (the losses compared), and BF16 with one padded
                  batch a step (what a PEFT user runs on a BF16-capable CPU; --no-peft-bf16 skips it;
                  --no-peft-fp32 skips the FP32 one, the slow one, for a shorter speed figure)
                  (FP32), the same batches in the same order (checked: every step's token and
                  target counts equal nightlora's)
  llama.cpp       llama-cpp-python with nightlora's adapter (lora_path), then the merged model:
                  next-token agreement with nightlora on the held-out contexts, and the held-out
                  accuracy llama.cpp itself gives
Exit status 1 if llama.cpp refuses a file or a required agreement fails."""
import argparse
import json
import os
import re
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "llamacpp"))
sys.path.insert(0, HERE)
import real  # noqa: E402  (bench/llamacpp/real.py: logits comparison, llama.cpp wrapper)
from peft_lora import Renderer  # noqa: E402


def run(cmd, **kw):
    t0 = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if r.returncode:
        sys.exit(f"{' '.join(cmd[:2])} failed:\n{r.stderr.strip()[-2000:]}")
    return r, time.time() - t0


def nl_eval(a, adapter=None):
    cmd = [a.bin, "eval", "--model", a.model, "--data", a.test]
    if adapter:
        cmd += ["--adapter", adapter]
    r, dt = run(cmd)
    m = re.search(r"loss ([0-9.]+).*accuracy ([0-9.]+)% \((\d+)/(\d+)\)", r.stdout)
    if not m:
        sys.exit(f"cannot read nightlora eval's output: {r.stdout!r}")
    return {"loss": float(m.group(1)), "correct": int(m.group(3)), "n": int(m.group(4)), "s": dt}


def llamacpp_accuracy(ll, items):
    """Held-out accuracy as llama.cpp computes it: the choice with the highest summed log-likelihood."""
    correct = 0
    for ctx, choices, ans in items:
        scores = []
        for c in choices:
            z = ll.logits(ctx + c)
            m = z.max(-1, keepdims=True)
            lp = z - m - np.log(np.exp(z - m).sum(-1, keepdims=True))
            scores.append(sum(lp[len(ctx) - 1 + j, c[j]] for j in range(len(c))))
        correct += int(int(np.argmax(scores)) == ans)
    return correct


def agreement(a, ll, model, items, adapter, n):
    """Next-token distributions after the first n held-out contexts: llama.cpp vs nightlora."""
    worst = None
    agree = 0
    for ctx, _, _ in items[:n]:
        ours = real.nl_logits(a.bin, model, ctx, os.path.join(a.work, "probe.f32"), adapter=adapter)[-1:]
        theirs = ll.last_logits(ctx)[None, :]
        c = real.compare_logits(ours, theirs)
        agree += int(c["top1"] == 1.0)
        if worst is None or c["max_kl"] > worst["max_kl"]:
            worst = c
    return agree, worst


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="build/nightlora")
    ap.add_argument("--model", required=True)
    ap.add_argument("--train", required=True)
    ap.add_argument("--test", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--alpha", type=float, default=32)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--steps", type=int, default=44)
    ap.add_argument("--batch-tokens", type=int, default=512)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--probe", type=int, default=20, help="held-out contexts for the next-token agreement")
    ap.add_argument("--no-peft", action="store_true")
    ap.add_argument("--no-peft-bf16", action="store_true", help="only the FP32 per-sequence PEFT peer")
    ap.add_argument("--no-peft-fp32", action="store_true", help="only the BF16 padded PEFT peer (the speed figure)")
    ap.add_argument("--no-llamacpp", action="store_true", help="skip llama.cpp with the adapter and the merged model")
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    hyper = ["--rank", str(a.rank), "--alpha", str(a.alpha), "--lr", str(a.lr), "--warmup", str(a.warmup),
             "--steps", str(a.steps), "--batch-tokens", str(a.batch_tokens), "--seed", str(a.seed)]
    print(f"model {os.path.basename(a.model)}; data {os.path.basename(a.train)} / {os.path.basename(a.test)}; "
          f"rank {a.rank}, alpha {a.alpha:g}, targets q,k,v,o,gate,up,down, lr {a.lr:g} (warm-up {a.warmup}, cosine "
          f"to {0.1 * a.lr:g}), {a.steps} steps of <= {a.batch_tokens} tokens, seed {a.seed}, {a.threads} threads",
          flush=True)

    # --- nightlora
    base = nl_eval(a)
    ad = os.path.join(a.work, "adapter.gguf")
    log = os.path.join(a.work, "train-log.jsonl")
    if os.path.exists(log):
        os.remove(log)
    r, train_wall = run([a.bin, "train", "--model", a.model, "--data", a.train, "--out", ad, "--no-shuffle",
                         "--threads", str(a.threads), "--log-json", log, "--quiet"] + hyper)
    policy = [l for l in r.stderr.splitlines() if l.startswith(("service:", "precision"))]
    steps = [json.loads(l) for l in open(log)]
    nl_tokens = sum(s["tokens"] for s in steps)
    nl_step_s = sum(s["seconds"] for s in steps)
    after = nl_eval(a, ad)
    print(f"nightlora: base {base['correct']}/{base['n']}, after {after['correct']}/{after['n']}; "
          f"{nl_tokens} tokens in {nl_step_s:.1f} s of steps ({train_wall:.1f} s wall)", flush=True)
    for l in policy:
        print("  " + l)

    # --- PEFT
    peft_res = peft_bf16 = None
    if not a.no_peft:
        def peft_run(name, extra):
            out = os.path.join(a.work, name)
            run([sys.executable, os.path.join(HERE, "peft_lora.py"), "--model", a.model, "--train", a.train,
                 "--test", a.test, "--out", out, "--threads", str(a.threads)] + hyper + extra)
            r = json.load(open(out))
            r["same_batches"] = [(s["tokens"], s["targets"]) for s in steps] == [(s["tokens"], s["targets"])
                                                                                 for s in r["steps"]]
            print(f"PEFT {r.get('dtype', 'fp32')}{' padded' if r.get('padded') else ''}: base "
                  f"{r.get('base_correct', '-')}/{r['n_test']}, after {r['correct']}/{r['n_test']}; {r['tokens']} "
                  f"tokens in {r['train_s']:.1f} s; batches {'identical to' if r['same_batches'] else 'DIFFERENT from'} "
                  f"nightlora's", flush=True)
            return r
        if not a.no_peft_fp32:
            peft_res = peft_run("peft.json", [])
        # what a PEFT user runs on a BF16-capable CPU: BF16 weights, one padded batch a step
        if not a.no_peft_bf16:
            peft_bf16 = peft_run("peft-bf16.json", ["--dtype", "bf16", "--padded", "--no-base-eval"])

    # --- llama.cpp with the adapter, and the merged model
    ll_acc = llm_acc = ag = agm = worst = worstm = nm = None
    if not a.no_llamacpp:
        rend = Renderer(a.model)
        items = [rend.choice_item(json.loads(l)) for l in open(a.test) if l.strip()]
        ll = real.LlamaCpp(a.model, a.threads, lora=ad)
        ag, worst = agreement(a, ll, a.model, items, ad, a.probe)
        ll_acc = llamacpp_accuracy(ll, items)
        merged = os.path.join(a.work, "merged.gguf")
        run([a.bin, "merge", "--model", a.model, "--adapter", ad, "--out", merged])
        llm = real.LlamaCpp(merged, a.threads)
        agm, worstm = agreement(a, llm, merged, items, None, a.probe)
        llm_acc = llamacpp_accuracy(llm, items)
        nm = nl_eval(argparse.Namespace(**{**vars(a), "model": merged}))

    n = after["n"]
    pct = lambda c: f"{100.0 * c / n:.1f}% ({c}/{n})"  # noqa: E731
    print()
    print("| run | held-out accuracy | training tokens/s | agreement with nightlora |")
    print("|---|---|---|---|")
    print(f"| base model (nightlora eval) | {pct(base['correct'])} | | |")
    if peft_res:
        print(f"| base model (transformers) | {pct(peft_res['base_correct'])} | | |")
    print(f"| nightlora LoRA | {pct(after['correct'])} | {nl_tokens / nl_step_s:.0f} | |")
    if peft_res:
        ratio = (nl_tokens / nl_step_s) / peft_res["tokens_per_s"]
        print(f"| transformers + PEFT LoRA (FP32) | {pct(peft_res['correct'])} | {peft_res['tokens_per_s']:.0f} "
              f"(nightlora {ratio:.2f}x) | same batches: {'yes' if peft_res['same_batches'] else 'NO'} |")
    if peft_bf16:
        ratio = (nl_tokens / nl_step_s) / peft_bf16["tokens_per_s"]
        print(f"| transformers + PEFT LoRA (BF16, one padded batch a step) | {pct(peft_bf16['correct'])} | "
              f"{peft_bf16['tokens_per_s']:.0f} (nightlora {ratio:.2f}x) | same batches: "
              f"{'yes' if peft_bf16['same_batches'] else 'NO'} |")
    if not a.no_llamacpp:
        print(f"| llama.cpp + nightlora's adapter | {pct(ll_acc)} | | next token: top-1 {ag}/{a.probe}, "
              f"max KL {worst['max_kl']:.1e} |")
        print(f"| llama.cpp, merged model | {pct(llm_acc)} (nightlora on it: {pct(nm['correct'])}) | | next token: "
              f"top-1 {agm}/{a.probe}, max KL {worstm['max_kl']:.1e} |")
    print()
    print("loss per step (nightlora" + (" / PEFT" if peft_res else "") + "):")
    for i in range(0, len(steps), max(1, len(steps) // 12)):
        s = steps[i]
        extra = f" / {peft_res['steps'][i]['loss']:.4f}" if peft_res else ""
        print(f"  step {s['step']:4d}: {s['loss']:.4f}{extra}")
    s = steps[-1]
    print(f"  step {s['step']:4d}: {s['loss']:.4f}" + (f" / {peft_res['steps'][-1]['loss']:.4f}" if peft_res else ""))
    summary = {"nightlora": {"base": base, "after": after, "tokens": nl_tokens, "step_s": nl_step_s,
                             "train_wall_s": train_wall, "steps": steps},
               "peft": peft_res, "peft_bf16": peft_bf16, "llamacpp": {"adapter_acc": ll_acc, "merged_acc": llm_acc, "agree": ag,
                                              "agree_merged": agm, "worst": worst, "worst_merged": worstm}}
    json.dump(summary, open(os.path.join(a.work, "summary.json"), "w"), indent=1)
    ok = a.no_llamacpp or (ag == a.probe and agm == a.probe and abs(ll_acc - after["correct"]) <= max(1, n // 100))
    if peft_res:
        ok = ok and peft_res["same_batches"]
    if peft_bf16:
        ok = ok and peft_bf16["same_batches"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
