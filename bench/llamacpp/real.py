#!/usr/bin/env python3
"""bench/llamacpp/real.py: nightlora against llama.cpp (llama-cpp-python) — and transformers, when
the environment has it — on a real pretrained model (SmolLM2-135M-Instruct, Q4_1 GGUF; Gemma 3
270M, Q4_K_M GGUF).

  real.py --bin build/nightlora --model SmolLM2-135M-Instruct.Q4_1.gguf --work DIR
          [--data-train T.jsonl --data-test E.jsonl] [--threads 2] [--steps 30]
          [--template FILE.jinja | --text] [--only ROWS] [--min-accuracy A]

The conversations are rendered by the model's own chat template (tokenizer.chat_template), or by
--template FILE.jinja for a model whose file has none (Gemma 3 270M is the base model: its GGUF
carries no template; tests/data/templates/gemma3.jinja is the -it models' one). A model with
neither, or --text, is checked on plain text: the prompts are completion prompts, `generate`
runs with --raw, and the training data are prompt/completion lines.

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
  tagging     (--only tagging) the held-out tagging task (--data-test, "choices") scored by
              `nightlora eval` before and after `train --epochs 1` on --data-train: passes when
              the accuracy after is at least --min-accuracy and above the one before; that
              adapter is then the one the adapter and merged rows check
"""
import argparse
import json
import math
import os
import re
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

# completion prompts, for a model checked on plain text (no chat template)
TEXT_PROMPTS = [
    "The capital of France is",
    "Here is a haiku about the sea:\n",
    "Three tips for staying focused while studying:\n1.",
    "A LoRA adapter is",
    "Note: Book the hotel for Friday\nTag:",
]
TEXT_ANSWER = " Paris. It is known for the Eiffel Tower, the Louvre and its cafés."

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
    # Gemma's turn markers and control tokens (plain text for other vocabularies)
    "<start_of_turn>user\nHello!<end_of_turn>\n<start_of_turn>model\n",
    "<bos><start_of_turn>user\nTag the note: Buy milk<end_of_turn>\n<start_of_turn>model\nshopping<end_of_turn>\n",
    "<eos>",
    "text<end_of_turn>more text<start_of_turn>",
    "<start_of_turn><start_of_turn>  <end_of_turn>\n\n",
    "<pad><unk><mask>[@BOS@]<start_of_image>",
]

# general.file_type -> the name llama.cpp gives it (for the rows' labels)
FILE_TYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 15: "Q4_K_M", 17: "Q5_K_M", 18: "Q6_K", 32: "BF16"}


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
        import no_amx  # noqa: F401  (before any Llama: AMX CPUs use llama.cpp's plain CPU path)
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


class Chat:
    """How the checks turn a prompt (and an answer) into tokens: through the chat template (the
    model's own, or --template FILE.jinja) rendered as HF does, or as plain text."""

    def __init__(self, tok, template_file, text):
        self.tok = tok
        self.file = template_file
        tpl = None
        if template_file:
            tpl = open(template_file, encoding="utf-8").read()
        elif not text:
            tpl = tok.metadata.get("tokenizer.chat_template")
        self.tpl = tpl
        self.prompts = PROMPTS if tpl else TEXT_PROMPTS
        ft = int(tok.metadata.get("general.file_type", "-1"))
        self.ftype = FILE_TYPES.get(ft, f"file type {ft}")

    def flags(self):
        """nightlora's flags for the same rendering (train, eval, generate)."""
        return ["--template", self.file] if self.file else []

    def text(self, messages, add_generation_prompt=True):
        import jinja2

        env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)

        def raise_exception(msg):
            raise jinja2.TemplateError(msg)

        env.globals["raise_exception"] = raise_exception
        return env.from_string(self.tpl).render(messages=messages, add_generation_prompt=add_generation_prompt,
                                                bos_token="", eos_token="")

    def ids(self, prompt, answer=None):
        """BOS (the tokenizer's), then the conversation; or the text itself without a template."""
        if not self.tpl:
            text = prompt + (answer or "")
        elif answer is None:
            text = self.text([{"role": "user", "content": prompt}])
        else:
            # the template's own end of the assistant turn
            text = self.text([{"role": "user", "content": prompt}, {"role": "assistant", "content": answer}],
                             add_generation_prompt=False)
        return self.tok.tokenize(text.encode("utf-8"), add_bos=True, special=True)


def vocab_cases():
    path = os.path.join(ROOT, "tests", "data", "tokenizer", "ggml-vocab-gpt-2.gguf.inp")
    cases = open(path, encoding="utf-8").read().split("\n__ggml_vocab_test__\n")
    cases[-1] = cases[-1].rstrip("\n") if cases[-1].endswith("\n") else cases[-1]
    return [c for c in cases if "\0" not in c]


class Report:
    def __init__(self):
        self.rows = []
        self.t = time.time()

    def add(self, name, ok, text):
        self.rows.append((name, ok, text))
        mark = {True: "ok", False: "FAIL", None: "skip"}[ok]
        now = time.time()
        print(f"  {name:<14} {mark:<5} {text} [{now - self.t:.0f} s]", flush=True)
        self.t = now

    def failed(self):
        return any(ok is False for _, ok, _ in self.rows)


def check_tokenizer(a, rep, chat):
    tok = chat.tok
    cases = vocab_cases() + EXTRA_STRINGS
    # the five prompts as the template renders them (special tokens as text), or as they are
    if chat.tpl:
        cases += [chat.text([{"role": "user", "content": p}]) for p in PROMPTS]
    else:
        cases += TEXT_PROMPTS
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


def check_logits(a, rep, chat, ll, llf):
    if chat.tpl:
        ids = chat.ids(PROMPTS[0], "The capital of France is Paris. It is known for the Eiffel Tower.")
    else:
        ids = chat.ids(TEXT_PROMPTS[0], TEXT_ANSWER)
    q = chat.ftype
    ours = nl_logits(a.bin, a.model, ids, os.path.join(a.work, "real-logits.f32"))
    theirs = ll.logits(ids)
    exact = llf.logits(ids)
    own = compare_logits(theirs, exact)  # llama.cpp's own rounding on this file
    ce = compare_logits(ours, exact)  # nightlora's own rounding (default compute)
    c = compare_logits(ours, theirs)
    ok = (c["mean_kl"] <= two_roundings(ce["mean_kl"], own["mean_kl"]) + 1e-5
          and c["max_kl"] <= two_roundings(ce["max_kl"], own["max_kl"]) + 1e-4
          and c["top1"] >= own["top1"] - 0.02)
    rep.add("logits", ok, f"default flags vs llama.cpp on the {q} file, " + fmt_cmp(c))
    rep.add("  rounding", None, f"llama.cpp on the {q} file vs llama.cpp on its F32 expansion (its 8-bit "
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


def default_kernels(a):
    """The service kernels nightlora's default flags pick on this machine (`check`'s line)."""
    r = run([a.bin, "check", "--model", a.model])
    return next((l.split("service kernels", 1)[1].strip() for l in r.stdout.splitlines() if "service kernels" in l), "?")


def check_generate(a, rep, chat, ll, llf):
    """Greedy continuations. On the F32 expansion llama.cpp's must be nightlora's exactly; on the
    quantized file they may part only where llama.cpp's 8-bit activations part from its own FP32
    run of the same weights (a near tie flipped by its rounding; the margins are printed).
    Where the default compute runs the BF16 tiles (AMX), which round every weight to BF16 as
    well as the activations (max |dlogit| ~0.5 on SmolLM2 against ~0.05 in FP32, measured on the
    emulator), a near tie within 32 tokens may flip: there the exact claims are made of
    `--compute f32` and the default's continuations are reported beside them."""
    tok, q, prompts = chat.tok, chat.ftype, chat.prompts
    same_exact = same_q = ties = 0
    kern = default_kernels(a)
    # the AMX tiles, and the bf16 mode of every CPU since its FWD multiplies by bf16(w), round the
    # weights to BF16: the exact claims are then made of --compute f32
    tiles = "amx-bf16" in kern or "BF16 weights" in kern
    if tiles:
        same_d = 0
        for p in prompts:
            r = run([a.bin, "generate", "--model", a.model, "--prompt", p, "--n", "32"] + (chat.flags() if chat.tpl else ["--raw"]))
            ours = r.stdout[:-1] if r.stdout.endswith("\n") else r.stdout
            if not chat.tpl and ours.startswith(p):
                ours = ours[len(p):]
            ids = chat.ids(p) if chat.tpl else tok.tokenize(p.encode("utf-8"), add_bos=True, special=False)
            same_d += r.returncode == 0 and ours == tok.detokenize(llf.greedy(ids, 32)).decode("utf-8", errors="replace")
        default_row = (f"default flags ({kern}): llama.cpp on the F32 expansion gives nightlora's continuation on "
                       f"{same_d}/{len(prompts)} (not a verdict: the default rounds the weights to BF16)")
    for p in prompts:
        r = run([a.bin, "generate", "--model", a.model, "--prompt", p, "--n", "32"]
                + (chat.flags() if chat.tpl else ["--raw"]) + (["--compute", "f32"] if tiles else []))
        if r.returncode:
            rep.add("generate", False, f"nightlora generate failed: {r.stderr.strip()}")
            return
        ours = r.stdout[:-1] if r.stdout.endswith("\n") else r.stdout
        if not chat.tpl and ours.startswith(p):
            ours = ours[len(p):]  # --raw prints the prompt before its continuation
        ids = chat.ids(p) if chat.tpl else tok.tokenize(p.encode("utf-8"), add_bos=True, special=False)
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
        # where do llama.cpp's two runs (quantized, F32 expansion) part, and by how much?
        k = next((i for i in range(min(len(gen_q), len(gen_f))) if gen_q[i] != gen_f[i]), None)
        if exact and k is not None:
            zq = ll.logits(ids + gen_q[:k + 1])[-2]
            zf = llf.logits(ids + gen_f[:k + 1])[-2]
            tq, tf = gen_q[k], gen_f[k]
            ties += 1
            print(f"    {p!r}: llama.cpp's {q} run parts from its own F32 run (= nightlora's) at token {k}: "
                  f"{tq} over {tf} by {zq[tq] - zq[tf]:.3f} logits, where FP32 activations put {tf} first by "
                  f"{zf[tf] - zf[tq]:.3f}")
    n = len(prompts)
    ok = same_exact == n and same_q + ties == n
    rep.add("generate", ok, f"greedy, 32 tokens, five {'prompts' if chat.tpl else 'text prompts (--raw)'}"
            f"{', --compute f32 (the default rounds the weights to BF16)' if tiles else ''}: llama.cpp "
            f"on the F32 expansion gives nightlora's continuation on {same_exact}/{n}; on the {q} file on "
            f"{same_q}/{n}, the other {n - same_q} where llama.cpp's own run on the F32 expansion parts from it ({ties})")
    if tiles:
        rep.add("  default", None, default_row)


def probe_ids(chat):
    if chat.tpl:
        return chat.ids("Note: Pick up eggs at the store on Friday")
    return chat.ids("Note: Pick up eggs at the store on Friday\nTag:")


def dequant(model, out):
    if not os.path.exists(out) or os.path.getmtime(out) < os.path.getmtime(model):
        subprocess.run([sys.executable, os.path.join(HERE, "dequant.py"), model, out], check=True)
    return out


def next_token_check(a, model, ids, adapter=None, f32_model=None):
    """nightlora's next-token logits (default flags) vs llama.cpp's on the same file (bounded by
    llama.cpp's own rounding, as in check_logits) and on its F32 expansion (close).
    Where the default compute runs the BF16 tiles (AMX: every weight rounded to BF16, as in
    check_generate), a near tie at the probe may flip there: the F32-expansion claims (same
    top-1, KL within TOL_EXACT) are then made of `--compute f32`, and the default's figures are
    printed beside them and held to the on-the-file bound."""
    ours = nl_logits(a.bin, model, ids, os.path.join(a.work, "real-probe.f32"), adapter=adapter)[-1:]
    q = LlamaCpp(model, a.threads, lora=adapter).last_logits(ids)[None, :]
    f = LlamaCpp(f32_model, a.threads, lora=adapter).last_logits(ids)[None, :]
    cq, cf, own = compare_logits(ours, q), compare_logits(ours, f), compare_logits(q, f)
    tiles = "amx-bf16" in default_kernels(a)
    exact = cf
    if tiles:
        ours_x = nl_logits(a.bin, model, ids, os.path.join(a.work, "real-probe-x.f32"), extra=("--compute", "f32"),
                           adapter=adapter)[-1:]
        exact = compare_logits(ours_x, f)
    ok = (exact["top1"] == 1.0 and exact["max_kl"] <= max(TOL_EXACT["max_kl"], own["max_kl"])
          and cq["max_kl"] <= two_roundings(cf["max_kl"], own["max_kl"]) + 1e-4)
    text = (f"next token vs llama.cpp: on the file KL {cq['max_kl']:.2e} (its own rounding {own['max_kl']:.2e}), "
            f"top-1 {'same' if cq['top1'] == 1 else 'differs'}; on the F32 expansion KL {cf['max_kl']:.2e}, top-1 "
            f"{'same' if cf['top1'] == 1 else 'differs'}")
    if tiles:
        text += (f" (default flags, the BF16 tiles); --compute f32 on the F32 expansion KL {exact['max_kl']:.2e}, "
                 f"top-1 {'same' if exact['top1'] == 1 else 'differs'}")
    return ok, text


def check_adapter(a, rep, chat, f32_file, trained=None):
    """trained: (adapter, what) from the tagging row, else a short run here."""
    if trained:
        ad, what = trained
    else:
        ad = os.path.join(a.work, "real-adapter.gguf")
        t0 = time.time()
        r = run([a.bin, "train", "--model", a.model, "--data", a.data_train, "--out", ad, "--steps", str(a.steps),
                 "--rank", "8", "--alpha", "16", "--lr", "1e-3", "--batch-tokens", "512", "--seed", "1", "--quiet"]
                + chat.flags())
        if r.returncode:
            rep.add("adapter", False, f"nightlora train failed: {r.stderr.strip()[-300:]}")
            return
        what = f"{a.steps} steps ({time.time() - t0:.0f} s), rank 8 on every projection"
    ids = probe_ids(chat)
    try:
        ok, text = next_token_check(a, a.model, ids, adapter=ad, f32_model=f32_file)
    except Exception as e:  # noqa: BLE001 — llama.cpp refusing the file is the finding
        rep.add("adapter", False, f"llama.cpp refuses {ad}: {e}")
        return
    rep.add("adapter", ok, f"{what}, loaded by llama.cpp (lora_path): " + text)
    merged = os.path.join(a.work, "real-merged.gguf")
    if os.path.exists(merged):
        os.remove(merged)  # merge does not overwrite
    r = run([a.bin, "merge", "--model", a.model, "--adapter", ad, "--out", merged])
    if r.returncode:
        rep.add("merged", False, f"nightlora merge failed: {r.stderr.strip()}")
        return
    # merge's summary line: the types it wrote and what it kept of the adapter
    retyped = [ln for ln in r.stderr.splitlines() if ln.startswith("merged ")]
    try:
        ok, text = next_token_check(a, merged, ids, f32_model=dequant(merged, merged + ".f32.gguf"))
    except Exception as e:  # noqa: BLE001
        rep.add("merged", False, f"llama.cpp refuses {merged}: {e}")
        return
    kept = "; ".join(retyped) if retyped else "merge printed no summary"
    rep.add("merged", ok, f"merged ({kept}), loaded by llama.cpp: " + text)


def accuracy(a, chat, adapter=None):
    """`nightlora eval` on --data-test: (accuracy, seconds)."""
    t0 = time.time()
    r = run([a.bin, "eval", "--model", a.model, "--data", a.data_test] + (["--adapter", adapter] if adapter else [])
            + chat.flags())
    if r.returncode:
        raise RuntimeError(f"nightlora eval failed: {r.stderr.strip()[-300:]}")
    m = re.search(r"accuracy ([0-9.]+)% \((\d+)/(\d+)\)", r.stdout)
    if not m:
        raise RuntimeError(f"nightlora eval printed no accuracy: {r.stdout.strip()[-300:]}")
    return int(m.group(2)) / int(m.group(3)), f"{m.group(1)}% ({m.group(2)}/{m.group(3)})", time.time() - t0


def check_tagging(a, rep, chat):
    """The held-out tagging task before and after one epoch of training; returns the adapter."""
    ad = os.path.join(a.work, "real-tagging-adapter.gguf")
    log = os.path.join(a.work, "real-tagging-log.jsonl")
    for f in (ad, log):
        if os.path.exists(f):
            os.remove(f)
    try:
        before, before_s, t_eval = accuracy(a, chat)
    except RuntimeError as e:
        rep.add("tagging", False, str(e))
        return None
    t0 = time.time()
    r = run([a.bin, "train", "--model", a.model, "--data", a.data_train, "--out", ad, "--rank", "16", "--alpha", "32",
             "--lr", "1e-3", "--warmup", "5", "--epochs", "1", "--batch-tokens", "512", "--seed", "1",
             "--log-json", log, "--quiet"] + chat.flags())
    dt = time.time() - t0
    if r.returncode:
        rep.add("tagging", False, f"nightlora train failed: {r.stderr.strip()[-300:]}")
        return None
    steps = [json.loads(ln) for ln in open(log, encoding="utf-8") if ln.strip()]
    steps = [s for s in steps if "loss" in s and "step" in s]
    n_tok = sum(s.get("tokens", 0) for s in steps)
    try:
        after, after_s, _ = accuracy(a, chat, ad)
    except RuntimeError as e:
        rep.add("tagging", False, str(e))
        return None
    ok = after >= a.min_accuracy and after > before
    losses = f"loss {steps[0]['loss']:.2f} -> {steps[-1]['loss']:.2f}, " if steps else ""
    rate = f", {n_tok / dt:.0f} tokens/s" if n_tok else ""
    rep.add("tagging", ok, f"held-out accuracy {before_s} before, {after_s} after one epoch ({len(steps)} steps of "
            f"512 tokens, rank 16, {losses}{n_tok} tokens in {dt:.0f} s{rate}; eval {t_eval:.0f} s; needs "
            f">= {a.min_accuracy * 100:.0f}% and a gain)")
    return ad, f"the tagging adapter ({len(steps)} steps, rank 16 on every projection)"


def check_tied_head(a, rep, chat, f32_file):
    ad = os.path.join(a.work, "real-output-adapter.gguf")
    if os.path.exists(ad):
        os.remove(ad)
    r = run([a.bin, "train", "--model", a.model, "--data", a.data_train, "--out", ad, "--steps", "2",
             "--targets", "output", "--rank", "4", "--batch-tokens", "256", "--seed", "1", "--quiet"] + chat.flags())
    if r.returncode:
        msg = r.stderr.strip().splitlines()[-1] if r.stderr.strip() else ""
        ok = "output" in msg and "tied" in msg and not os.path.exists(ad)
        rep.add("tied head", ok, f"--targets output refused at train time: {msg!r}")
        return
    # llama.cpp's loader in a process of its own first: a file it cannot take may crash it
    ids = probe_ids(chat)
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
    ap.add_argument("--data-test", default=None, help="held-out data with choices (the tagging row; default: "
                    "the test file beside --data-train)")
    ap.add_argument("--template", default=None, help="a chat template (FILE.jinja) for a model without one")
    ap.add_argument("--text", action="store_true", help="plain text, even when the model has a template")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--min-accuracy", type=float, default=0.9)
    ap.add_argument("--only", default="tokenizer,logits,hf,generate,adapter,tied")
    a = ap.parse_args()
    if a.data_test is None:
        a.data_test = a.data_train.replace("-train.jsonl", "-test.jsonl")
    os.makedirs(a.work, exist_ok=True)
    only = set(a.only.split(","))
    rep = Report()
    t_start = time.time()
    tok = LlamaCpp(a.model, a.threads, n_ctx=64).llm  # the vocabulary and metadata
    chat = Chat(tok, a.template, a.text)
    print(f"  ({'chat template: ' + (a.template or 'the GGUF' + chr(39) + 's own') if chat.tpl else 'plain text: no chat template'};"
          f" {chat.ftype})", flush=True)
    if "tokenizer" in only:
        check_tokenizer(a, rep, chat)
    ll = LlamaCpp(a.model, a.threads)
    f32_file = dequant(a.model, os.path.join(a.work, "real-f32.gguf"))
    llf = LlamaCpp(f32_file, a.threads)
    if "logits" in only or "hf" in only:
        ids, f32 = check_logits(a, rep, chat, ll, llf)
        if "hf" in only:
            check_transformers(a, rep, ids, f32)
    if "generate" in only:
        check_generate(a, rep, chat, ll, llf)
    trained = check_tagging(a, rep, chat) if "tagging" in only else None
    if "adapter" in only and ("tagging" not in only or trained):
        check_adapter(a, rep, chat, f32_file, trained)
    if "tied" in only:
        check_tied_head(a, rep, chat, f32_file)
    print(f"  ({time.time() - t_start:.0f} s)", flush=True)
    return 1 if rep.failed() else 0


if __name__ == "__main__":
    sys.exit(main())
