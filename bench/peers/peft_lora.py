#!/usr/bin/env python3
"""bench/peers/peft_lora.py: the same LoRA run as `nightlora train` in Hugging Face transformers +
PEFT on the CPU, for bench/peers_compare.sh.

  peft_lora.py --model M.gguf --train T.jsonl --test E.jsonl --out RESULT.json
               [--rank 16 --alpha 32 --dropout 0.05 --lr 1e-3 --lr-min 1e-4 --warmup 5 --steps N
                --batch-tokens 512 --clip 1.0 --seed 1 --threads 2 --targets q,k,v,o,gate,up,down]
               [--dtype fp32|bf16] [--padded]

Two ways to run it: the default, FP32 with one forward/backward per sequence (the reference the
losses are compared with), and what a PEFT user runs on a BF16-capable CPU: --dtype bf16 (the base
and the LoRA weights in BF16, as from_pretrained(dtype=torch.bfloat16) + get_peft_model give;
the loss in FP32) --padded (each step's sequences right-padded into one batch with an attention
mask, one forward and one backward a step). Tokens/s counts real tokens, never padding.

The base comes from the same GGUF (transformers dequantizes it to FP32 on load). The data are the
same JSONL lines, tokenized by llama.cpp's tokenizer (llama-cpp-python, vocab only; bench/llamacpp/
real.py checks nightlora's ids equal it), with nightlora's loss mask (src/data/dataset.h):
{"messages": ...} conversations rendered with the GGUF's own chat template (its Jinja text, as
transformers' apply_chat_template renders it), targets the assistant content and its <|im_end|>;
{"prompt": P, "completion": C} lines (a model without a chat template) as BOS + tok(P) + tok(C) +
EOS, P and C tokenized apart without special-token parsing, targets tok(C) and the EOS. The
schedule is nightlora's (train/optim.c): linear warm-up, then cosine from lr to lr-min, AdamW
(0.9, 0.999, 1e-8, no weight decay), global-norm clipping; steps take whole examples in file
order up to --batch-tokens tokens (nightlora's batcher with --no-shuffle), and the loss of a step
is the mean over its target tokens. Evaluation: the "choices" lines, the choice with the highest
summed log-likelihood after the context (the conversation + the generation prompt).

Writes RESULT.json: per-step loss / tokens / targets, training wall time and tokens/s (the
optimizer steps only, not loading), held-out accuracy before and after."""
import argparse
import json
import math
import os
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TQDM_DISABLE", "1")

TARGETS = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "o_proj", "gate": "gate_proj", "up": "up_proj",
           "down": "down_proj"}


class Renderer:
    """Chat rendering and tokenization shared with the llama.cpp side."""

    def __init__(self, model):
        import jinja2
        from llama_cpp import Llama

        self.vocab = Llama(model_path=model, vocab_only=True, verbose=False)
        tpl = self.vocab.metadata.get("tokenizer.chat_template")
        self.tpl = jinja2.Environment(trim_blocks=True, lstrip_blocks=True).from_string(tpl) if tpl else None
        self.bos = self.vocab.tokenize(b"", add_bos=True, special=True)  # [BOS] if the vocabulary adds one
        self.eos = self.vocab.token_eos()

    def render(self, messages, gen):
        return self.tpl.render(messages=messages, add_generation_prompt=gen, bos_token="", eos_token="")

    def ids(self, text, special=True, bos=False):
        return self.vocab.tokenize(text.encode("utf-8"), add_bos=bos, special=special)

    def train_line(self, line):
        """Token ids and targets of one training line ({"messages": ...} or prompt/completion)."""
        if "messages" in line:
            return self.train_example(line["messages"])
        p, c = self.ids(line["prompt"], special=False), self.ids(line["completion"], special=False)
        ids = list(self.bos) + p + c + [self.eos]
        return ids, [0] * (len(self.bos) + len(p)) + [1] * (len(c) + 1)

    def train_example(self, messages):
        """Token ids and targets: every assistant message's content and its end-of-turn token."""
        ids, tgt = list(self.bos), [0] * len(self.bos)
        prefix = ""
        for i, m in enumerate(messages):
            head = self.render(messages[:i], False) if i else ""
            assert head == prefix, "the template is not a concatenation of turns"
            full = self.render(messages[: i + 1], False)
            turn = full[len(head):]
            if m["role"] == "assistant":
                start = "<|im_start|>assistant\n"
                end = "<|im_end|>"
                assert turn.startswith(start) and turn.endswith(end + "\n"), turn
                a = self.ids(start)
                c = self.ids(m["content"], special=False)
                e = self.ids(end + "\n")
                ids += a + c + e
                tgt += [0] * len(a) + [1] * len(c) + [1] + [0] * (len(e) - 1)
            else:
                t = self.ids(turn)
                ids += t
                tgt += [0] * len(t)
            prefix = full
        return ids, tgt

    def choice_item(self, line):
        if "messages" in line:
            ctx = self.ids(self.render(line["messages"], True), bos=True)
        else:  # a prompt line: BOS + tok(P), no special-token parsing
            ctx = list(self.bos) + self.ids(line["prompt"], special=False)
        choices = [self.ids(c, special=False) for c in line["choices"]]
        ans = line["answer"]
        ans = line["choices"].index(ans) if isinstance(ans, str) else int(ans)
        return ctx, choices, ans


def lr_at(step, total, lr, lr_min, warmup):
    """nightlora's nl_lr_at (train/optim.c)."""
    if step <= warmup:
        return lr * step / warmup
    if total <= warmup:
        return lr
    p = min(1.0, (step - warmup - 1) / (total - warmup))
    return lr_min + (lr - lr_min) * 0.5 * (1.0 + math.cos(math.pi * p))


def batches(lengths, batch_tokens, total_steps):
    """nightlora's nl_batcher in file order: whole examples up to batch_tokens, never across epochs."""
    out, i, n = [], 0, len(lengths)
    while len(out) < total_steps:
        b, tokens = [], 0
        while i < n:
            t = lengths[i]
            if b and tokens + t > batch_tokens:
                break
            b.append(i)
            tokens += t
            i += 1
            if tokens >= batch_tokens:
                break
        if i >= n:
            i = 0
        out.append(b)
    return out


def accuracy(model, items, torch):
    correct = 0
    with torch.no_grad():
        for ctx, choices, ans in items:
            scores = []
            for c in choices:
                x = torch.tensor([ctx + c])
                logp = torch.log_softmax(model(x).logits[0].float(), -1)
                scores.append(sum(float(logp[len(ctx) - 1 + j, c[j]]) for j in range(len(c))))
            correct += int(max(range(len(scores)), key=lambda k: scores[k]) == ans)
    return correct, len(items)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--train", required=True)
    ap.add_argument("--test", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--alpha", type=float, default=32)
    ap.add_argument("--dropout", type=float, default=0.05)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--lr-min", type=float, default=None)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--batch-tokens", type=int, default=512)
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--targets", default="q,k,v,o,gate,up,down")
    ap.add_argument("--no-base-eval", action="store_true")
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument("--padded", action="store_true", help="one padded batch a step (attention mask)")
    a = ap.parse_args()
    lr_min = 0.1 * a.lr if a.lr_min is None else a.lr_min

    import torch
    import transformers
    import peft
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    rend = Renderer(a.model)
    train = [rend.train_line(json.loads(l)) for l in open(a.train) if l.strip()]
    test = [rend.choice_item(json.loads(l)) for l in open(a.test) if l.strip()]

    t0 = time.time()
    model = AutoModelForCausalLM.from_pretrained(os.path.dirname(os.path.abspath(a.model)),
                                                 gguf_file=os.path.basename(a.model), dtype=torch.float32)
    if a.dtype == "bf16":
        model = model.to(torch.bfloat16)
    load_s = time.time() - t0
    res = {"versions": {"torch": torch.__version__, "transformers": transformers.__version__, "peft": peft.__version__},
           "load_s": load_s, "threads": a.threads, "dtype": a.dtype, "padded": a.padded}
    model.eval()
    if not a.no_base_eval:
        t0 = time.time()
        res["base_correct"], res["n_test"] = accuracy(model, test, torch)
        res["eval_s"] = time.time() - t0
    cfg = peft.LoraConfig(r=a.rank, lora_alpha=a.alpha, lora_dropout=a.dropout, bias="none",
                          target_modules=[TARGETS[t] for t in a.targets.split(",")], task_type="CAUSAL_LM")
    model = peft.get_peft_model(model, cfg)
    res["trainable_params"] = sum(p.numel() for p in model.parameters() if p.requires_grad)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=a.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    plan = batches([len(ids) for ids, _ in train], a.batch_tokens, a.steps)
    steps = []
    model.train()
    t_train = time.time()
    for s, b in enumerate(plan, 1):
        ts = time.time()
        lr = lr_at(s, a.steps, a.lr, lr_min, a.warmup)
        for g in opt.param_groups:
            g["lr"] = lr
        n_tgt = sum(sum(train[i][1][1:]) for i in b)
        n_tok = sum(len(train[i][0]) for i in b)
        loss_sum = 0.0
        opt.zero_grad(set_to_none=True)
        if a.padded:
            # one right-padded batch: padding is masked out of attention and of the loss
            L = max(len(train[i][0]) for i in b)
            x = torch.zeros((len(b), L), dtype=torch.long)
            att = torch.zeros((len(b), L), dtype=torch.long)
            m = torch.zeros((len(b), L - 1), dtype=torch.bool)
            for r, i in enumerate(b):
                ids, tgt = train[i]
                x[r, :len(ids)] = torch.tensor(ids)
                att[r, :len(ids)] = 1
                m[r, :len(ids) - 1] = torch.tensor(tgt[1:], dtype=torch.bool)
            logits = model(input_ids=x, attention_mask=att).logits[:, :-1].float()
            y = x[:, 1:]
            ce = torch.nn.functional.cross_entropy(logits[m], y[m], reduction="sum")
            (ce / n_tgt).backward()
            loss_sum = float(ce.detach())
        for i in ([] if a.padded else b):
            ids, tgt = train[i]
            x = torch.tensor([ids])
            logits = model(x).logits[0, :-1].float()
            y = torch.tensor(ids[1:])
            m = torch.tensor(tgt[1:], dtype=torch.bool)
            ce = torch.nn.functional.cross_entropy(logits[m], y[m], reduction="sum")
            (ce / n_tgt).backward()
            loss_sum += float(ce)
        gnorm = float(torch.nn.utils.clip_grad_norm_(params, a.clip if a.clip > 0 else float("inf")))
        opt.step()
        steps.append({"step": s, "loss": loss_sum / n_tgt, "tokens": n_tok, "targets": n_tgt, "lr": lr,
                      "grad_norm": gnorm, "dt": time.time() - ts})
    train_s = time.time() - t_train
    res["steps"] = steps
    res["train_s"] = train_s
    res["tokens"] = sum(x["tokens"] for x in steps)
    res["tokens_per_s"] = res["tokens"] / train_s
    model.eval()
    t0 = time.time()
    res["correct"], res["n_test"] = accuracy(model, test, torch)
    res["eval_after_s"] = time.time() - t0
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
