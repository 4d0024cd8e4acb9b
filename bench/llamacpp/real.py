#!/usr/bin/env python3
"""bench/llamacpp/real.py: nightlora against llama.cpp (llama-cpp-python) — and transformers, when
the environment has it — on a real pretrained model (SmolLM2-135M-Instruct, Q4_1 GGUF).

  real.py --bin build/nightlora --model SmolLM2-135M-Instruct.Q4_1.gguf --work DIR
          [--data-train T.jsonl --data-test E.jsonl] [--threads 2] [--steps 30]

Checks, one row each (exit status 1 if any fails):
  tokenizer   nightlora tokenize = llama.cpp's tokenize on a set of strings (llama.cpp's own
              tokenizer test cases for GPT-2-style BPE plus chat text with the template's special
              tokens): plain (no BOS, special text not parsed) and special (as the vocabulary
              says, control-token text parsed)
  logits      `nightlora logits` with default flags vs llama.cpp's logits on the same file, every
              row of a chat sequence (the tolerances: see Q4_1_MARGIN and TOL_EXACT below)
  f32 vs HF   `nightlora logits --precision f32` vs transformers' FP32 forward of the same GGUF
              (transformers dequantizes it); skipped when torch/transformers are not importable
  generate    greedy `nightlora generate` (default flags, the model's chat template) = llama.cpp's
              greedy continuation of the same prompt, 32 tokens, five prompts
  adapter     an adapter trained by `nightlora train` on the model: llama.cpp loads it (lora_path)
              and its next-token probabilities agree with `nightlora logits --adapter`
  merged      `nightlora merge` of that adapter: llama.cpp loads the merged model and agrees
On a quantized file llama.cpp rounds its activations to 8 bits, so each comparison is made on the
file (bounded by llama.cpp's own distance to its FP32 run of the same weights) and on the file's
F32 expansion (bench/llamacpp/dequant.py; close agreement required).
  tied head   `train --targets output` on the tied head: refused with the reason, or (if written)
              llama.cpp and merge accept it
"""
import argparse
import json
import math
import os
import subprocess
import sys
import time

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # transformers reads the local GGUF only
os.environ.setdefault("TQDM_DISABLE", "1")
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

# Tolerances. On a quantized file llama.cpp's CPU path rounds the activations to 8 bits (Q8_1
# blocks for Q4_1 weights, Q8_0 for the Q8_0 head) before every product; nightlora's default
# compute (--compute auto) rounds them to BF16 on a CPU with AVX512_BF16 or AMX, and keeps them in
# FP32 with --compute f32. So the two are compared on the Q4_1 file and on its F32 expansion
# (bench/llamacpp/dequant.py), where llama.cpp computes in FP32 (its KV cache is F16):
#  - --compute f32 on the file vs llama.cpp on the F32 expansion: close (TOL_EXACT);
#  - default flags vs the F32 expansion: no farther than TOL_EXACT or llama.cpp's own rounding
#    (llama.cpp on the file vs on the expansion), whichever is larger;
#  - default flags vs llama.cpp on the file: two roundings of the same exact run, so no farther
#    apart than the sum of their distances from it, with a 1.5x margin. sqrt(KL) is the distance
#    that adds (for small differences KL is half a squared Fisher-Rao length).
Q4_1_MARGIN = 1.5
TOL_EXACT = {"max_kl": 1e-3, "top1": 1.0}


def two_roundings(a, b):
    """The bound on the KL between two roundings whose KLs from the exact run are a and b."""
    return Q4_1_MARGIN * (math.sqrt(a) + math.sqrt(b)) ** 2
# FP32 against transformers: the same dequantized weights in FP32 on both sides, the sums in a
# different order: a few 1e-4 of the logits at most.
TOL_F32 = {"max_abs": 5e-3, "max_kl": 1e-5}

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Give me three tips for staying focused while studying.",
    "Explain in one sentence what a LoRA adapter is.",
    "Tag this note with one word (work, family, shopping, travel or health): Book the hotel for Friday",
]

EXTRA_STRINGS = [
    "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>system\nYou tag notes.<|im_end|>\n<|im_start|>user\nBuy milk<|im_end|>\n",
    "<|endoftext|>",
    "text<|im_end|>more text<|im_start|>",
    "<|im_start|><|im_start|>  <|im_end|>",
    "Note: Book the hotel for Friday\nTag: travel",
    "def f(x):\n    return x ** 2  # square\n",
    "The year 2026 has 365 days; 1234567890 and 3.14159.",
    "naïve café — “quotes” … 日本語のテキスト 🤗🦙",
    "   leading spaces and trailing spaces   ",
    "I'll, you're, he's, we've, they'd, don't, CAN'T",
]


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


def nl_tokenize(bin_, model, text, special):
    cmd = [bin_, "tokenize", "--model", model, "--text", text] + ([] if special else ["--no-special"])
    r = run(cmd)
    if r.returncode:
        raise RuntimeError(f"nightlora tokenize failed: {r.stderr.strip()}")
    return [int(x) for x in r.stdout.split()]


def nl_logits(bin_, model, ids, out, extra=(), adapter=None):
    cmd = [bin_, "logits", "--model", model, "--tokens", " ".join(map(str, ids)), "--out", out]
    if adapter:
        cmd += ["--adapter", adapter]
    r = run(cmd + list(extra))
    if r.returncode:
        raise RuntimeError(f"nightlora logits failed: {r.stderr.strip()}")
    a = np.fromfile(out, dtype=np.float32)
    return a.reshape(len(ids), -1).astype(np.float64)


def softmax(z):
    z = z - z.max(axis=-1, keepdims=True)
    p = np.exp(z)
    return p / p.sum(axis=-1, keepdims=True)


def compare_logits(ours, theirs):
    """Row-wise: top-1 agreement, max |Δ logit|, KL(theirs || ours)."""
    po, pt = softmax(ours), softmax(theirs)
    kl = (pt * (np.log(np.maximum(pt, 1e-300)) - np.log(np.maximum(po, 1e-300)))).sum(axis=-1)
    return {
        "rows": ours.shape[0],
        "top1": float((ours.argmax(-1) == theirs.argmax(-1)).mean()),
        "max_abs": float(np.abs(ours - theirs).max()),
        "max_kl": float(kl.max()),
        "mean_kl": float(kl.mean()),
        "max_dp": float(np.abs(po - pt).max()),
        "scale": float(theirs.std()),
    }


def fmt_cmp(c):
    return (f"{c['rows']} rows: top-1 agrees {c['top1'] * 100:.1f}%, max |dlogit| {c['max_abs']:.3g} "
            f"(logit std {c['scale']:.2f}), KL mean {c['mean_kl']:.2e} max {c['max_kl']:.2e}, max |dp| {c['max_dp']:.2e}")


class LlamaCpp:
    def __init__(self, model, threads, lora=None, n_ctx=512):
        from llama_cpp import Llama

        # logits_all: llama-cpp-python keeps a row's logits in .scores only with it
        self.llm = Llama(model_path=model, n_ctx=n_ctx, n_batch=n_ctx, n_threads=threads,
                         n_threads_batch=threads, lora_path=lora, logits_all=True, verbose=False)

    def logits(self, ids):
        self.llm.reset()
        self.llm.eval(ids)
        return np.array(self.llm.scores[: len(ids)], dtype=np.float64)

    def last_logits(self, ids):
        self.llm.reset()
        self.llm.eval(ids)
        return np.array(self.llm.scores[len(ids) - 1], dtype=np.float64)

    def greedy(self, ids, n):
        """llama.cpp's greedy continuation: argmax of each step's logits, up to n tokens or EOG."""
        import llama_cpp

        vocab = llama_cpp.llama_model_get_vocab(self.llm.model)
        self.llm.reset()
        self.llm.eval(ids)
        out = []
        for _ in range(n):
            t = int(np.argmax(self.llm.scores[self.llm.n_tokens - 1]))
            if llama_cpp.llama_vocab_is_eog(vocab, t):
                break
            out.append(t)
            self.llm.eval([t])
        return out


def chat_text(llm, messages):
    """The conversation as the model's own (Jinja) template renders it, as HF does."""
    import jinja2

    tpl = llm.metadata["tokenizer.chat_template"]
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    return env.from_string(tpl).render(messages=messages, add_generation_prompt=True, bos_token="", eos_token="")


def vocab_cases():
    path = os.path.join(ROOT, "tests", "data", "tokenizer", "ggml-vocab-gpt-2.gguf.inp")
    cases = open(path, encoding="utf-8").read().split("\n__ggml_vocab_test__\n")
    cases[-1] = cases[-1].rstrip("\n") if cases[-1].endswith("\n") else cases[-1]
    return [c for c in cases if "\0" not in c]


class Report:
    def __init__(self):
        self.rows = []

    def add(self, name, ok, text):
        self.rows.append((name, ok, text))
        mark = {True: "ok", False: "FAIL", None: "skip"}[ok]
        print(f"  {name:<14} {mark:<5} {text}", flush=True)

    def failed(self):
        return any(ok is False for _, ok, _ in self.rows)


def check_tokenizer(a, rep, tok):
    cases = vocab_cases() + EXTRA_STRINGS
    # the five prompts as the template renders them (special tokens as text)
    cases += [chat_text(tok, [{"role": "user", "content": p}]) for p in PROMPTS]
    bad = []
    n = 0
    for text in cases:
        for special in (False, True):
            ours = nl_tokenize(a.bin, a.model, text, special)
            theirs = tok.tokenize(text.encode("utf-8"), add_bos=special, special=special)
            n += 1
            if ours != theirs:
                bad.append((text, special, ours, theirs))
    for text, special, ours, theirs in bad[:5]:
        print(f"    differs ({'special' if special else 'plain'}): {text!r}\n      nightlora {ours}\n      llama.cpp {theirs}")
    rep.add("tokenizer", not bad, f"{n - len(bad)}/{n} tokenizations identical ({len(cases)} strings, plain and special)")


def chat_ids(tok, prompt, answer=None):
    text = chat_text(tok, [{"role": "user", "content": prompt}])
    if answer is not None:
        text += answer + "<|im_end|>\n"
    return tok.tokenize(text.encode("utf-8"), add_bos=True, special=True)


def check_logits(a, rep, tok, ll, llf):
    ids = chat_ids(tok, PROMPTS[0], "The capital of France is Paris. It is known for the Eiffel Tower.")
    ours = nl_logits(a.bin, a.model, ids, os.path.join(a.work, "real-logits.f32"))
    theirs = ll.logits(ids)
    exact = llf.logits(ids)
    own = compare_logits(theirs, exact)  # llama.cpp's own rounding on this file
    ce = compare_logits(ours, exact)  # nightlora's own rounding (default compute)
    c = compare_logits(ours, theirs)
    ok = (c["mean_kl"] <= two_roundings(ce["mean_kl"], own["mean_kl"]) + 1e-5
          and c["max_kl"] <= two_roundings(ce["max_kl"], own["max_kl"]) + 1e-4
          and c["top1"] >= own["top1"] - 0.02)
    rep.add("logits", ok, "default flags vs llama.cpp on the Q4_1 file, " + fmt_cmp(c))
    rep.add("  rounding", None, "llama.cpp on the Q4_1 file vs llama.cpp on its F32 expansion (its 8-bit "
            "activations), " + fmt_cmp(own))
    ok = ce["max_kl"] <= max(TOL_EXACT["max_kl"], own["max_kl"]) and ce["top1"] >= min(TOL_EXACT["top1"], own["top1"])
    rep.add("logits default", ok, "default flags (the CPU's default compute) vs llama.cpp on the F32 expansion, "
            + fmt_cmp(ce))
    x = nl_logits(a.bin, a.model, ids, os.path.join(a.work, "real-logits-c32.f32"), ["--compute", "f32"])
    c = compare_logits(x, exact)
    ok = c["max_kl"] <= TOL_EXACT["max_kl"] and c["top1"] >= TOL_EXACT["top1"]
    rep.add("logits exact", ok, "--compute f32 (the stored weights, FP32 activations) vs llama.cpp on the F32 "
            "expansion, " + fmt_cmp(c))
    f32 = nl_logits(a.bin, a.model, ids, os.path.join(a.work, "real-logits-f32.f32"), ["--precision", "f32"])
    c = compare_logits(f32, exact)
    ok = c["max_kl"] <= TOL_EXACT["max_kl"] and c["top1"] >= TOL_EXACT["top1"]
    rep.add("logits f32", ok, "--precision f32 vs llama.cpp on the F32 expansion, " + fmt_cmp(c))
    return ids, f32


def check_transformers(a, rep, ids, f32):
    try:
        import torch
        from transformers import AutoModelForCausalLM
    except Exception as e:  # noqa: BLE001 — any import failure means "not available"
        rep.add("f32 vs HF", None, f"transformers/torch not importable here ({type(e).__name__}): "
                "bench/peers_compare.sh installs them into the same environment")
        return
    torch.set_num_threads(a.threads)
    t0 = time.time()
    m = AutoModelForCausalLM.from_pretrained(os.path.dirname(os.path.abspath(a.model)),
                                             gguf_file=os.path.basename(a.model), dtype=torch.float32)
    m.eval()
    with torch.no_grad():
        hf = m(torch.tensor([ids])).logits[0].double().numpy()
    c = compare_logits(f32, hf)
    ok = c["max_abs"] <= TOL_F32["max_abs"] and c["max_kl"] <= TOL_F32["max_kl"] and c["top1"] == 1.0
    rep.add("f32 vs HF", ok, f"--precision f32 vs transformers {__import__('transformers').__version__} FP32 "
            f"(GGUF dequantized; loaded in {time.time() - t0:.0f} s), " + fmt_cmp(c))


def check_generate(a, rep, tok, ll, llf):
    """Greedy continuations. On the F32 expansion llama.cpp's must be nightlora's exactly; on the
    Q4_1 file they may part only where llama.cpp's 8-bit activations part from its own FP32 run
    of the same weights (a near tie flipped by its rounding; the margins are printed)."""
    same_exact = same_q = ties = 0
    for p in PROMPTS:
        r = run([a.bin, "generate", "--model", a.model, "--prompt", p, "--n", "32"])
        if r.returncode:
            rep.add("generate", False, f"nightlora generate failed: {r.stderr.strip()}")
            return
        ours = r.stdout[:-1] if r.stdout.endswith("\n") else r.stdout
        ids = chat_ids(tok, p)
        gen_f = llf.greedy(ids, 32)
        exact = ours == tok.detokenize(gen_f).decode("utf-8", errors="replace")
        if exact:
            same_exact += 1
        else:
            print(f"    differs from llama.cpp (F32 expansion) on {p!r}:\n      nightlora {ours!r}\n"
                  f"      llama.cpp {tok.detokenize(gen_f).decode('utf-8', errors='replace')!r}")
        gen_q = ll.greedy(ids, 32)
        if ours == tok.detokenize(gen_q).decode("utf-8", errors="replace"):
            same_q += 1
            continue
        # where do llama.cpp's two runs (Q4_1, F32 expansion) part, and by how much?
        k = next((i for i in range(min(len(gen_q), len(gen_f))) if gen_q[i] != gen_f[i]), None)
        if exact and k is not None:
            zq = ll.logits(ids + gen_q[:k + 1])[-2]
            zf = llf.logits(ids + gen_f[:k + 1])[-2]
            tq, tf = gen_q[k], gen_f[k]
            ties += 1
            print(f"    {p!r}: llama.cpp's Q4_1 run parts from its own F32 run (= nightlora's) at token {k}: "
                  f"{tq} over {tf} by {zq[tq] - zq[tf]:.3f} logits, where FP32 activations put {tf} first by "
                  f"{zf[tf] - zf[tq]:.3f}")
    ok = same_exact == len(PROMPTS) and same_q + ties == len(PROMPTS)
    rep.add("generate", ok, f"greedy, 32 tokens, five prompts: llama.cpp on the F32 expansion gives nightlora's "
            f"continuation on {same_exact}/{len(PROMPTS)}; on the Q4_1 file on {same_q}/{len(PROMPTS)}, the "
            f"other {len(PROMPTS) - same_q} where llama.cpp's own run on the F32 expansion parts from it ({ties})")


def probe_ids(tok):
    return chat_ids(tok, "Note: Pick up eggs at the store on Friday")


def dequant(model, out):
    if not os.path.exists(out) or os.path.getmtime(out) < os.path.getmtime(model):
        subprocess.run([sys.executable, os.path.join(HERE, "dequant.py"), model, out], check=True)
    return out


def next_token_check(a, model, ids, adapter=None, f32_model=None):
    """nightlora's next-token logits (default flags) vs llama.cpp's on the same file (bounded by
    llama.cpp's own rounding, as in check_logits) and on its F32 expansion (close)."""
    ours = nl_logits(a.bin, model, ids, os.path.join(a.work, "real-probe.f32"), adapter=adapter)[-1:]
    q = LlamaCpp(model, a.threads, lora=adapter).last_logits(ids)[None, :]
    f = LlamaCpp(f32_model, a.threads, lora=adapter).last_logits(ids)[None, :]
    cq, cf, own = compare_logits(ours, q), compare_logits(ours, f), compare_logits(q, f)
    ok = (cf["top1"] == 1.0 and cf["max_kl"] <= max(TOL_EXACT["max_kl"], own["max_kl"])
          and cq["max_kl"] <= two_roundings(cf["max_kl"], own["max_kl"]) + 1e-4)
    text = (f"next token vs llama.cpp: on the file KL {cq['max_kl']:.2e} (its own rounding {own['max_kl']:.2e}), "
            f"top-1 {'same' if cq['top1'] == 1 else 'differs'}; on the F32 expansion KL {cf['max_kl']:.2e}, top-1 "
            f"{'same' if cf['top1'] == 1 else 'differs'}")
    return ok, text


def check_adapter(a, rep, tok, f32_file):
    ad = os.path.join(a.work, "real-adapter.gguf")
    t0 = time.time()
    r = run([a.bin, "train", "--model", a.model, "--data", a.data_train, "--out", ad, "--steps", str(a.steps),
             "--rank", "8", "--alpha", "16", "--lr", "1e-3", "--batch-tokens", "512", "--seed", "1", "--quiet"])
    if r.returncode:
        rep.add("adapter", False, f"nightlora train failed: {r.stderr.strip()[-300:]}")
        return
    dt = time.time() - t0
    ids = probe_ids(tok)
    try:
        ok, text = next_token_check(a, a.model, ids, adapter=ad, f32_model=f32_file)
    except Exception as e:  # noqa: BLE001 — llama.cpp refusing the file is the finding
        rep.add("adapter", False, f"llama.cpp refuses {ad}: {e}")
        return
    rep.add("adapter", ok, f"{a.steps} steps ({dt:.0f} s), rank 8 on every projection, loaded by llama.cpp "
            f"(lora_path): " + text)
    merged = os.path.join(a.work, "real-merged.gguf")
    r = run([a.bin, "merge", "--model", a.model, "--adapter", ad, "--out", merged])
    if r.returncode:
        rep.add("merged", False, f"nightlora merge failed: {r.stderr.strip()}")
        return
    try:
        ok, text = next_token_check(a, merged, ids, f32_model=dequant(merged, merged + ".f32.gguf"))
    except Exception as e:  # noqa: BLE001
        rep.add("merged", False, f"llama.cpp refuses {merged}: {e}")
        return
    rep.add("merged", ok, "merged (each tensor keeps its type), loaded by llama.cpp: " + text)


def check_tied_head(a, rep, tok, f32_file):
    ad = os.path.join(a.work, "real-output-adapter.gguf")
    if os.path.exists(ad):
        os.remove(ad)
    r = run([a.bin, "train", "--model", a.model, "--data", a.data_train, "--out", ad, "--steps", "2",
             "--targets", "output", "--rank", "4", "--batch-tokens", "256", "--seed", "1", "--quiet"])
    if r.returncode:
        msg = r.stderr.strip().splitlines()[-1] if r.stderr.strip() else ""
        ok = "output" in msg and "tied" in msg and not os.path.exists(ad)
        rep.add("tied head", ok, f"--targets output refused at train time: {msg!r}")
        return
    # llama.cpp's loader in a process of its own first: a file it cannot take may crash it
    ids = probe_ids(tok)
    r = run([sys.executable, os.path.join(HERE, "probs.py"), a.model, " ".join(map(str, ids)),
             os.path.join(a.work, "tied.json"), ad])
    if r.returncode:
        why = r.stderr.strip().splitlines()[-1] if r.stderr.strip() else f"exit status {r.returncode}"
        rep.add("tied head", False, f"train wrote {os.path.basename(ad)} (--targets output on the tied head); "
                f"llama.cpp cannot load it: {why}")
        return
    ok, text = next_token_check(a, a.model, ids, adapter=ad, f32_model=f32_file)
    merged = os.path.join(a.work, "real-output-merged.gguf")
    rm = run([a.bin, "merge", "--model", a.model, "--adapter", ad, "--out", merged])
    rep.add("tied head", ok and rm.returncode == 0, f"output adapter written and loaded by llama.cpp: {text}; merge "
            f"{'accepts it' if rm.returncode == 0 else 'fails: ' + rm.stderr.strip()}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="build/nightlora")
    ap.add_argument("--model", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--data-train", default=os.path.join(ROOT, "examples", "tagging-chat-train.jsonl"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--only", default="tokenizer,logits,hf,generate,adapter,tied")
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    only = set(a.only.split(","))
    rep = Report()
    tok = LlamaCpp(a.model, a.threads, n_ctx=64).llm  # the vocabulary and metadata
    if "tokenizer" in only:
        check_tokenizer(a, rep, tok)
    ll = LlamaCpp(a.model, a.threads)
    f32_file = dequant(a.model, os.path.join(a.work, "real-f32.gguf"))
    llf = LlamaCpp(f32_file, a.threads)
    if "logits" in only or "hf" in only:
        ids, f32 = check_logits(a, rep, tok, ll, llf)
        if "hf" in only:
            check_transformers(a, rep, ids, f32)
    if "generate" in only:
        check_generate(a, rep, tok, ll, llf)
    if "adapter" in only:
        check_adapter(a, rep, tok, f32_file)
    if "tied" in only:
        check_tied_head(a, rep, tok, f32_file)
    return 1 if rep.failed() else 0


if __name__ == "__main__":
    sys.exit(main())
