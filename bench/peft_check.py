#!/usr/bin/env python3
"""bench/peft_check.py: nightlora's PEFT adapters against Hugging Face PEFT on a real model
(SmolLM2-135M-Instruct: llama architecture, Q4_1 GGUF; Gemma 3 270M: gemma3, Q4_K_M GGUF with Q5_0,
Q4_K, Q6_K and Q8_0 tensors), for bench/peft_check.sh.

  peft_check.py --bin build/nightlora --model M.gguf --data train.jsonl --work DIR [--steps 4 --threads 2]

Both sides compute with the same weights: transformers dequantizes the GGUF to FP32 on load (and
undoes llama.cpp's q/k row permutation of llama models; gemma3's converter permutes nothing), nightlora
runs with --precision f32 --compute f32. So the only difference left is the order of FP32 sums, and
the logits must agree to TOL.

  f32 vs HF  the base model without an adapter: `nightlora logits` vs transformers' FP32 forward

  out   nightlora trains a few steps (rank 8, every q,k,v,o,gate,up,down) and exports the adapter
        (`nightlora export --format peft`); PEFT's PeftModel.from_pretrained loads the directory on
        the transformers base; its logits on a few prompts vs `nightlora logits --adapter A.gguf`.
        Also: the exported q/k lora_B, put back through llama.cpp's converter permute (the formula
        of convert_hf_to_gguf.py's LlamaModel.permute; on gemma3 as they are), equal the GGUF's
        lora_b bit for bit; on llama the same PEFT model with q/k lora_B left in the GGUF's order
        misses by far more than TOL (the permutation matters); `nightlora logits --adapter DIR`
        equals `--adapter A.gguf` bit for bit.
  in    PEFT makes an adapter (r 8, down_proj r 4 through rank_pattern, lora_alpha 24, B random
        and nonzero) and saves it (save_pretrained: adapter_model.safetensors); nightlora reads the
        directory: `nightlora logits --adapter DIR` vs PEFT's logits, `nightlora eval` loss on the
        prompts vs PEFT's cross-entropy; `export --format gguf` then `--format peft` gives back
        PEFT's tensors bit for bit.
  readme (--readme README.md, SmolLM2 only) the README's PEFT lines as printed: its `nightlora export
        --format peft ... --base-model HuggingFaceTB/SmolLM2-135M-Instruct` on the adapter trained
        above (the README's build/nightlora, $M and my-adapter.gguf are this run's) writes that id as
        base_model_name_or_path, and its `python -c "from peft import AutoPeftModelForCausalLM; ..."`
        runs verbatim (exit 0), then once more with the logits of the `m` it loads: within TOL of
        `nightlora logits --adapter`. There is no network to huggingface.co here, so the id resolves
        offline (HF_HUB_OFFLINE=1) to a Hugging Face cache under DIR (HF_HOME) whose snapshot of that
        repository is the transformers model this check loaded from the GGUF (FP32 safetensors and
        its config.json): the loading path is AutoPeftModelForCausalLM's own (config, base by
        name, adapter), the base's weights are the GGUF's, not the repository's BF16 originals.

Prints one row per check and writes DIR/peft-check.json; exits 1 when a check fails."""
import argparse
import json
import os
import re
import subprocess
import sys
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TQDM_DISABLE", "1")

import numpy as np

TOL = 2e-3        # max |Δ logit|, FP32 against FP32 (measured 5.4e-4 with logits moved by 31, 9e-5)
LOSS_TOL = 2e-4   # eval loss (nightlora prints 4 decimals)
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
PROMPTS = [
    "The capital of France is",
    "Note: Book the hotel for Friday\nTag:",
    "<|im_start|>user\nWhat is the tag of: Refill at the physio<|im_end|>\n<|im_start|>assistant\n",
    "def fibonacci(n):\n    if n < 2:\n        return n\n",
]
F32 = ["--precision", "f32", "--compute", "f32"]


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(f"{' '.join(cmd[:2])} failed ({r.returncode}): {r.stderr.strip()}")
    return r.stdout


class Nl:
    def __init__(self, a):
        self.a = a

    def tokens(self, text):
        return [int(x) for x in run([self.a.bin, "tokenize", "--model", self.a.model, "--text", text]).split()]

    def logits(self, ids, adapter, tag):
        out = os.path.join(self.a.work, f"logits-{tag}.f32")
        run([self.a.bin, "logits", "--model", self.a.model, "--tokens", " ".join(map(str, ids)),
             "--out", out, "--threads", str(self.a.threads)] + (["--adapter", adapter] if adapter else []) + F32)
        return np.fromfile(out, dtype=np.float32).reshape(len(ids), -1)

    def eval_loss(self, adapter, data):
        out = run([self.a.bin, "eval", "--model", self.a.model, "--adapter", adapter, "--data", data,
                   "--threads", str(self.a.threads)] + F32)
        return float(re.search(r"loss ([-0-9.]+)", out).group(1))


class Report:
    def __init__(self):
        self.rows, self.failed = [], 0

    def add(self, name, ok, detail):
        ok = bool(ok)
        self.rows.append({"check": name, "ok": ok, "detail": detail})
        self.failed += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {name}: {detail}", flush=True)


def llama_permute(w, n_head, n_head_kv):
    """convert_hf_to_gguf.py's LlamaModel.permute (HF rows -> GGUF rows), in numpy."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def compare_logits(rep, name, ours, theirs, base, what):
    """max |Δ| of ours against theirs within TOL, and the adapter's own effect (theirs against the
    base) far above it, so an adapter that did nothing could not pass."""
    d = max(float(np.abs(o - t).max()) for o, t in zip(ours, theirs))
    effect = max(float(np.abs(t - b).max()) for t, b in zip(theirs, base))
    top1 = np.mean(np.concatenate([o.argmax(-1) == t.argmax(-1) for o, t in zip(ours, theirs)]))
    rep.add(name, d <= TOL and effect > 100 * TOL, f"{what}: max |Δ| {d:.2e} (tol {TOL:g}), top-1 {100 * top1:.1f}%; "
            f"the adapter moves the logits by up to {effect:.3f}")


def readme_block(path):
    """The README's export command (backslash lines joined) and its python -c command, from the
    fenced block that loads the export with AutoPeftModelForCausalLM."""
    text = open(path).read()
    for block in re.findall(r"```\n(.*?)```", text, re.S):
        if "AutoPeftModelForCausalLM" not in block:
            continue
        lines = re.sub(r"\\\n\s*", " ", block).splitlines()
        export = next(l for l in lines if " export " in l and "--format peft" in l)
        py = next(l for l in lines if l.startswith("python -c ") and "AutoPeftModelForCausalLM" in l)
        return export, py
    raise RuntimeError(f"{path}: no block loads an export with AutoPeftModelForCausalLM")


def readme_rows(a, rep, nl_gguf, base, prompts, ours, base_logits):
    """The README's PEFT lines as printed (the module docstring's `readme` row)."""
    import shlex
    export, py = readme_block(a.readme)
    # the README's export, with this run's binary, model and adapter, in a directory of its own
    wd = os.path.join(a.work, "readme")
    os.makedirs(wd, exist_ok=True)
    argv = shlex.split(export.split(" #")[0])
    absp = lambda x: os.path.abspath(x) if os.sep in x else x  # noqa: E731 (run from another directory)
    sub = {"build/nightlora": absp(a.bin), "$M": os.path.abspath(a.model), "my-adapter.gguf": os.path.abspath(nl_gguf)}
    argv = [sub.get(x, x) for x in argv]
    out_dir = argv[argv.index("--out") + 1]
    repo = argv[argv.index("--base-model") + 1]
    subprocess.run(["rm", "-rf", os.path.join(wd, out_dir)], check=True)
    r = subprocess.run(argv, cwd=wd, capture_output=True, text=True)
    named = None
    if r.returncode == 0:
        with open(os.path.join(wd, out_dir, "adapter_config.json")) as f:
            named = json.load(f).get("base_model_name_or_path")
    rep.add("readme: export", r.returncode == 0 and named == repo,
            f"the README's `{export.split(' #')[0].strip()}`: exit {r.returncode}, base_model_name_or_path {named!r}"
            + (f" ({r.stderr.strip()})" if r.returncode else ""))
    if named != repo:
        return
    # the Hugging Face cache the id resolves to, offline: its snapshot is the base loaded above
    hf = os.path.join(a.work, "hf")
    repo_dir = os.path.join(hf, "hub", "models--" + repo.replace("/", "--"))
    snap = os.path.join(repo_dir, "snapshots", "0" * 40)
    if not os.path.exists(os.path.join(snap, "config.json")):
        os.makedirs(os.path.join(repo_dir, "refs"), exist_ok=True)
        # save_pretrained refuses a model loaded from a GGUF: its weights (FP32, dequantized) and
        # its config without the GGUF's quantization record, as a checkpoint transformers reads
        from safetensors.torch import save_model
        os.makedirs(snap, exist_ok=True)
        save_model(base, os.path.join(snap, "model.safetensors"), metadata={"format": "pt"})
        cfg = base.config.to_dict()
        cfg.pop("quantization_config", None)
        with open(os.path.join(snap, "config.json"), "w") as f:
            json.dump(cfg, f, indent=1)
        with open(os.path.join(repo_dir, "refs", "main"), "w") as f:
            f.write("0" * 40)
    env = dict(os.environ, HF_HOME=hf, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    cmd = py.split("  #")[0].strip()
    r = subprocess.run(["sh", "-c", cmd], cwd=wd, env=env, capture_output=True, text=True)
    rep.add("readme: AutoPeftModelForCausalLM", r.returncode == 0,
            f"the README's `{cmd}` as printed (python: {sys.executable}), {repo} from the offline cache: exit {r.returncode}"
            + (f" ({r.stderr.strip()[-400:]})" if r.returncode else ""))
    if r.returncode:
        return
    # the same lines again, then the logits of the model they loaded
    code = shlex.split(cmd)[2]
    ids_path, out_path = os.path.join(wd, "ids.json"), os.path.join(wd, "readme-logits.npz")
    with open(ids_path, "w") as f:
        json.dump(prompts, f)
    code += ("\nimport json, numpy, torch\nm.eval()\nwith torch.no_grad():\n"
             f"    z = [m(torch.tensor([ids])).logits[0].float().numpy() for ids in json.load(open({ids_path!r}))]\n"
             f"numpy.savez({out_path!r}, *z)\nprint(type(m).__name__, m.base_model.model.dtype)\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=wd, env=env, capture_output=True, text=True)
    if r.returncode:
        rep.add("readme: logits", False, f"the README's lines then the logits: exit {r.returncode} ({r.stderr.strip()[-400:]})")
        return
    z = np.load(out_path)
    theirs = [z[f"arr_{i}"] for i in range(len(prompts))]
    compare_logits(rep, "readme: logits", ours, theirs, base_logits,
                   f"the model the README's AutoPeftModelForCausalLM line loads ({r.stdout.strip()}) vs "
                   f"`nightlora logits --adapter A.gguf`, {sum(map(len, prompts))} positions")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--readme", help="README.md: run its PEFT export and AutoPeftModelForCausalLM lines as printed")
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    t_start = time.time()

    import torch
    import transformers
    import peft
    from safetensors.numpy import load_file
    from transformers import AutoModelForCausalLM
    import gguf

    torch.set_num_threads(a.threads)
    nl, rep = Nl(a), Report()
    prompts = [nl.tokens(p) for p in PROMPTS]

    # ---- out: nightlora -> PEFT
    nl_gguf = os.path.join(a.work, "nl.gguf")
    nl_dir = os.path.join(a.work, "nl-peft")
    t0 = time.time()
    run([a.bin, "train", "--model", a.model, "--data", a.data, "--out", nl_gguf, "--rank", "8", "--alpha", "16",
         "--lr", "1e-2", "--warmup", "0", "--steps", str(a.steps), "--batch-tokens", "256", "--threads", str(a.threads),
         "--seed", "1", "--quiet"])
    train_s = time.time() - t0
    print(f"nightlora trained {a.steps} steps in {train_s:.1f} s", flush=True)
    run([a.bin, "export", "--model", a.model, "--adapter", nl_gguf, "--format", "peft", "--out", nl_dir])

    def load_base():
        return AutoModelForCausalLM.from_pretrained(os.path.dirname(os.path.abspath(a.model)),
                                                    gguf_file=os.path.basename(a.model), dtype=torch.float32).eval()

    def hf_logits(model, ids):
        with torch.no_grad():
            return model(torch.tensor([ids])).logits[0].float().numpy()

    t0 = time.time()
    base = load_base()
    load_s = time.time() - t0
    n_head, n_kv = base.config.num_attention_heads, base.config.num_key_value_heads
    arch = gguf.GGUFReader(a.model).fields["general.architecture"]
    arch = bytes(arch.parts[arch.data[0]]).decode()
    permuted = arch == "llama"  # convert_hf_to_gguf.py permutes q/k rows of llama models only
    base_logits = [hf_logits(base, ids) for ids in prompts]
    ours_base = [nl.logits(ids, None, f"base{i}") for i, ids in enumerate(prompts)]
    d = max(float(np.abs(o - t).max()) for o, t in zip(ours_base, base_logits))
    top1 = np.mean(np.concatenate([o.argmax(-1) == t.argmax(-1) for o, t in zip(ours_base, base_logits)]))
    scale = float(np.concatenate([t.ravel() for t in base_logits]).std())
    rep.add("f32 vs HF", d <= TOL and top1 == 1.0,
            f"{arch}, no adapter: `nightlora logits --precision f32 --compute f32` vs transformers "
            f"{transformers.__version__} FP32 (GGUF dequantized, loaded in {load_s:.0f} s), "
            f"{sum(map(len, prompts))} positions: max |Δ| {d:.2e} (tol {TOL:g}, logit std {scale:.2f}), top-1 {100 * top1:.1f}%")
    pm = peft.PeftModel.from_pretrained(base, nl_dir).eval()
    theirs = [hf_logits(pm, ids) for ids in prompts]
    ours = [nl.logits(ids, nl_gguf, f"out{i}") for i, ids in enumerate(prompts)]
    compare_logits(rep, "out: logits", ours, theirs, base_logits,
                   f"PEFT {peft.__version__} on nightlora's exported adapter vs `nightlora logits --adapter A.gguf`, "
                   f"{sum(map(len, prompts))} positions")
    dir_logits = [nl.logits(ids, nl_dir, f"outdir{i}") for i, ids in enumerate(prompts)]
    same = all(np.array_equal(x, y) for x, y in zip(dir_logits, ours))
    rep.add("out: --adapter DIR", same, "`nightlora logits --adapter DIR` (the export read back) "
            + ("equals --adapter A.gguf bit for bit" if same else "differs from --adapter A.gguf"))

    # the export's q/k rows against llama.cpp's own permute formula (llama), and what skipping it costs
    st = load_file(os.path.join(nl_dir, "adapter_model.safetensors"))
    g = gguf.GGUFReader(nl_gguf)
    gt = {t.name: np.array(t.data) for t in g.tensors}
    n_qk, exact = 0, True
    for name, b in st.items():
        m = re.match(r"base_model\.model\.model\.layers\.(\d+)\.self_attn\.([qk])_proj\.lora_B\.weight$", name)
        if not m:
            continue
        kv = n_head if m.group(2) == "q" else n_kv
        gg = gt[f"blk.{m.group(1)}.attn_{m.group(2)}.weight.lora_b"].reshape(b.shape)
        exact &= np.array_equal(llama_permute(b, n_head, kv) if permuted else b, gg)
        n_qk += 1
    how = "through llama.cpp's LlamaModel.permute" if permuted else f"as they are ({arch}: the converter permutes nothing)"
    rep.add("out: q/k rows", exact and n_qk > 0, f"{n_qk} exported q/k lora_B {how} "
            + ("equal the GGUF's lora_b bit for bit" if exact else "differ from the GGUF's lora_b"))
    if permuted:
        saved = {}
        with torch.no_grad():
            for k in pm.state_dict():
                m = re.match(r".*layers\.(\d+)\.self_attn\.([qk])_proj\.lora_B\.default\.weight$", k)
                if m:
                    p = dict(pm.named_parameters())[k]
                    saved[k] = p.detach().clone()
                    p.copy_(torch.from_numpy(llama_permute(p.numpy(), n_head, n_head if m.group(2) == "q" else n_kv).copy()))
        unperm = [hf_logits(pm, ids) for ids in prompts]
        with torch.no_grad():
            for k, v in saved.items():
                dict(pm.named_parameters())[k].copy_(v)
        dn = max(float(np.abs(o - t).max()) for o, t in zip(ours, unperm))
        rep.add("out: without the permutation", dn > 10 * TOL,
                f"the same adapter with q/k lora_B left in the GGUF's row order: max |Δ| {dn:.3f} (the permutation is needed)")
    base = pm.unload()
    if a.readme:
        readme_rows(a, rep, nl_gguf, base, prompts, ours, base_logits)

    # ---- in: PEFT -> nightlora
    torch.manual_seed(7)
    cfg = peft.LoraConfig(r=8, lora_alpha=24, lora_dropout=0.0, bias="none", target_modules=TARGETS,
                          rank_pattern={"down_proj": 4}, task_type="CAUSAL_LM")
    pm = peft.get_peft_model(base, cfg).eval()
    with torch.no_grad():
        for k, p in pm.named_parameters():
            if "lora_B" in k:
                p.normal_(0.0, 0.02)
    peft_dir = os.path.join(a.work, "peft-made")
    pm.save_pretrained(peft_dir)
    theirs = [hf_logits(pm, ids) for ids in prompts]
    ours = [nl.logits(ids, peft_dir, f"in{i}") for i, ids in enumerate(prompts)]
    compare_logits(rep, "in: logits", ours, theirs, base_logits,
                   "`nightlora logits --adapter DIR` on PEFT's saved adapter vs PEFT")
    # eval loss: every token after the first is a target ({"tokens": ...} lines)
    data = os.path.join(a.work, "prompts.jsonl")
    with open(data, "w") as f:
        for ids in prompts:
            f.write(json.dumps({"tokens": ids}) + "\n")
    ce, n = 0.0, 0
    for ids, z in zip(prompts, theirs):
        lp = torch.log_softmax(torch.from_numpy(z[:-1]).double(), -1)
        ce -= float(lp[torch.arange(len(ids) - 1), torch.tensor(ids[1:])].sum())
        n += len(ids) - 1
    loss_peft = ce / n
    loss_nl = nl.eval_loss(peft_dir, data)
    rep.add("in: eval loss", abs(loss_nl - loss_peft) <= LOSS_TOL,
            f"`nightlora eval --adapter DIR` loss {loss_nl:.4f}, PEFT's cross-entropy {loss_peft:.6f} over {n} targets "
            f"(tol {LOSS_TOL:g})")
    # round trip through the GGUF form and back: PEFT's own tensors, bit for bit
    rt_gguf, rt_dir = os.path.join(a.work, "peft-made.gguf"), os.path.join(a.work, "peft-made-again")
    run([a.bin, "export", "--model", a.model, "--adapter", peft_dir, "--format", "gguf", "--out", rt_gguf])
    run([a.bin, "export", "--model", a.model, "--adapter", rt_gguf, "--format", "peft", "--out", rt_dir])
    st0 = load_file(os.path.join(peft_dir, "adapter_model.safetensors"))
    st1 = load_file(os.path.join(rt_dir, "adapter_model.safetensors"))
    same = st0.keys() == st1.keys() and all(np.array_equal(st0[k], st1[k]) for k in st0)
    rep.add("in: round trip", same, f"PEFT dir -> GGUF -> PEFT dir: {len(st0)} tensors "
            + ("equal PEFT's bit for bit" if same else "differ from PEFT's"))

    res = {"versions": {"torch": torch.__version__, "transformers": transformers.__version__, "peft": peft.__version__},
           "model": os.path.basename(a.model), "arch": arch, "tol": TOL, "train_s": train_s, "total_s": time.time() - t_start, "rows": rep.rows}
    with open(os.path.join(a.work, "peft-check.json"), "w") as f:
        json.dump(res, f, indent=1)
    print(f"peft_check: {len(rep.rows) - rep.failed}/{len(rep.rows)} checks passed in {time.time() - t_start:.0f} s")
    return 1 if rep.failed else 0


if __name__ == "__main__":
    sys.exit(main())
