#!/bin/sh
# Issue 13's benchmark rows (the matrix-engine issue), one run, one markdown table with its
# targets evaluated:
#   proj      `bench proj` on the qwen3-0.6b shapes (Q8_0 bytes) beside PyTorch BF16 F.linear (FWD)
#             and dy @ W (BWD) on the same shapes in the same run (bench/proj_torch.py's timing)
#   step      qwen3-0.6b `bench step --only c` vs PyTorch's BF16 LoRA step (bench/torch_compare.py's
#             step, in a process of its own for its peak RSS): tokens/s and peak RSS ratios
#   qwen35    qwen35-0.8b `bench step --only c --profile`: tokens/s and where the time goes
#   tagging   `train` on the tagging notes (examples/tagging-train.jsonl, ~40 tokens each, packed
#             into --batch-tokens 512) vs on 512-token sequences, qwen3-0.6b: the rate ratio
#             (tokens/s over steps 2..STEPS of --log-json)
#   kernels   the service line `train` prints at start-up (which kernels ran)
# Targets: on a machine whose kernel line says the service runs on the real AMX tiles
# ("amx-bf16" without "(emulated)"), the issue's AMX targets (proj FWD and BWD >= 0.8x PyTorch on
# every shape; step >= 2x PyTorch BF16 tokens/s at <= 0.5x its RSS; qwen35 >= 150 tokens/s;
# tagging >= 0.8x). Without AMX: the tagging target and, with --base BIN (an older nightlora),
# no row slower than BASE beyond 5% noise; every nightlora row then runs for both binaries in
# this run, alternating (which goes first swaps row by row).
#
#   sh bench/engine_rows.sh [--bin build/nightlora] [--base OLD_BIN] [--rounds N] [--threads 2] [--quick]
#
# --rounds N: every nightlora row N times (each binary's best counts; with --base the order of
# the two binaries swaps every round): on a loaded machine one round cannot resolve 5%.
# --quick: T = 64 and 64-token sequences, 1 rep, 3 training steps (a check of the script, not
# of the targets: the table says so). The models are made with `nightlora mkmodel` in a temp
# directory, removed at the end. PyTorch: $PYTHON, else the first of /usr/bin/python3, the model
# cache's venv ($NL_MODEL_CACHE/venv) and python3 that imports torch; without torch the PyTorch
# rows say "not installed". Not part of `make test` or .ci/run (it is a benchmark).
# Time: see docs/bench-proj.md ("One command for the rows").
set -eu
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(dirname "$HERE")
BIN=build/nightlora
BASE=
THREADS=2
QUICK=0
ROUNDS=1
while [ $# -gt 0 ]; do
    case "$1" in
    --bin) BIN=$2; shift 2 ;;
    --base) BASE=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --quick) QUICK=1; shift ;;
    -h | --help) sed -n '2,30p' "$0"; exit 0 ;;
    *) echo "engine_rows: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done
[ -x "$BIN" ] || { echo "engine_rows: $BIN: no such program (make build)" >&2; exit 2; }
[ -z "$BASE" ] || [ -x "$BASE" ] || { echo "engine_rows: --base $BASE: no such program" >&2; exit 2; }
if [ "$QUICK" = 1 ]; then T=64 REPS=1 STEPS=3; else T=512 REPS=3 STEPS=6; fi

PY=${PYTHON:-}
if [ -z "$PY" ]; then
    for p in /usr/bin/python3 "${NL_MODEL_CACHE:-$HOME/.cache/nightlora}/venv/bin/python" python3; do
        if command -v "$p" > /dev/null 2>&1 && "$p" -c 'import torch' > /dev/null 2>&1; then PY=$p; break; fi
    done
    [ -n "$PY" ] || PY=python3
fi
W=$(mktemp -d "${TMPDIR:-/tmp}/nl_engine_rows.XXXXXX")
trap 'rm -rf "$W"' EXIT INT TERM
t0=$(date +%s)
say() { echo "engine_rows: $*" >&2; }

say "models (mkmodel, Q8_0) into $W"
"$BIN" mkmodel --arch qwen3 --preset qwen3-0.6b --type q8_0 --out "$W/q06.gguf" > /dev/null
"$BIN" mkmodel --arch qwen35 --preset qwen35-0.8b --type q8_0 --out "$W/q35.gguf" > /dev/null
# T-token sequences of token ids (every one a target), one a step at --batch-tokens T
python3 - "$W/seq.jsonl" "$T" << 'EOF'
import json, random, sys
r = random.Random(7)
with open(sys.argv[1], "w") as f:
    for _ in range(16):
        n = int(sys.argv[2])
        f.write(json.dumps({"tokens": [r.randrange(1000, 150000) for _ in range(n)], "loss_mask": [1] * n}) + "\n")
EOF

# one nightlora binary's rows, tagged new|base: $1 tag, $2 binary, $3 row
row() {
    tag=${1}_$r b=$2 what=$3
    case "$what" in
    proj) "$b" bench proj --model "$W/q06.gguf" --tokens "$T" --threads "$THREADS" --reps "$REPS" --json > "$W/proj_$tag.json" ;;
    step) "$b" bench step --model "$W/q06.gguf" --tokens "$T" --threads "$THREADS" --reps "$REPS" --warmup 1 --only c --json \
        > "$W/step_$tag.json" 2> /dev/null ;;
    q35) "$b" bench step --model "$W/q35.gguf" --tokens "$T" --threads "$THREADS" --reps "$REPS" --warmup 1 --only c --profile \
        --json > "$W/q35_$tag.json" 2> /dev/null ;;
    notes | seq)
        if [ "$what" = notes ]; then data=$ROOT/examples/tagging-train.jsonl; else data=$W/seq.jsonl; fi
        rm -f "$W/${what}_$tag.jsonl"
        "$b" train --model "$W/q06.gguf" --data "$data" --out "$W/a_$tag.gguf" --steps "$STEPS" --batch-tokens "$T" \
            --threads "$THREADS" --thermal off --log-json "$W/${what}_$tag.jsonl" > "$W/${what}_$tag.txt" 2>&1 ;;
    esac
}
n=0
r=1
while [ "$r" -le "$ROUNDS" ]; do
    for what in proj step q35 notes seq; do
        say "$what (round $r of $ROUNDS)"
        if [ -n "$BASE" ] && [ $(((n + r) % 2)) = 0 ]; then row base "$BASE" "$what"; row new "$BIN" "$what"
        elif [ -n "$BASE" ]; then row new "$BIN" "$what"; row base "$BASE" "$what"
        else row new "$BIN" "$what"; fi
        n=$((n + 1))
    done
    r=$((r + 1))
done

say "PyTorch ($PY)"
# the PyTorch BF16 linear of every proj row, with bench/proj_torch.py's own timing
"$PY" - "$HERE" "$W/proj_new_1.json" "$W/torch_proj.json" "$THREADS" "$REPS" << 'EOF' || echo '{"error": "failed"}' > "$W/torch_proj.json"
import json, sys
sys.path.insert(0, sys.argv[1])
rows = json.load(open(sys.argv[2]))
try:
    import torch
except ImportError:
    json.dump({"error": "not installed"}, open(sys.argv[3], "w")); sys.exit(0)
import proj_torch
torch.set_num_threads(int(sys.argv[4]))
out = {"version": torch.__version__, "rows": []}
for r in rows:
    s = proj_torch.torch_seconds(torch, r["T"], r["k"], r["n"], r["dir"], int(sys.argv[5]))
    out["rows"].append(2.0 * r["T"] * r["n"] * r["k"] / s * 1e-9)
json.dump(out, open(sys.argv[3], "w"))
EOF
# the BF16 LoRA step of bench/torch_compare.py, alone in its process (its peak RSS)
"$PY" - "$HERE" "$W/torch_step.json" "$T" "$THREADS" "$REPS" << 'EOF' || echo '{"error": "failed"}' > "$W/torch_step.json"
import json, resource, sys
sys.path.insert(0, sys.argv[1])
try:
    import torch  # noqa: F401
except ImportError:
    json.dump({"error": "not installed"}, open(sys.argv[2], "w")); sys.exit(0)
import torch_compare
T = int(sys.argv[3])
secs, ver = torch_compare.torch_step_seconds(T, int(sys.argv[4]), int(sys.argv[5]), "bf16")
json.dump({"version": ver, "tokens_per_s": T / secs, "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024},
          open(sys.argv[2], "w"))
EOF

python3 - "$W" "$QUICK" "$T" "$STEPS" "$([ -n "$BASE" ] && echo 1 || echo 0)" "$(($(date +%s) - t0))" \
    "$(grep -o 'amx_[a-z0-9]*' /proc/cpuinfo 2> /dev/null | sort -u | tr '\n' ' ')" "$ROUNDS" << 'EOF'
import json, os, sys
W, quick, T, steps, has_base, secs, cpu = sys.argv[1], sys.argv[2] == "1", int(sys.argv[3]), int(sys.argv[4]), sys.argv[5] == "1", sys.argv[6], sys.argv[7].strip()
rounds = int(sys.argv[8])
def load1(name):
    try:
        return json.load(open(os.path.join(W, name)))
    except (OSError, ValueError):
        return None
def load(stem):  # the best round of a binary's row: proj per row, a step by tokens/s
    got = [j for j in (load1("%s_%d.json" % (stem, i)) for i in range(1, rounds + 1)) if j]
    if not got:
        return None
    if isinstance(got[0], list):
        best = [dict(r) for r in got[0]]
        for j in got[1:]:
            for b, r in zip(best, j):
                for k in ("host_gflops", "amx_gflops"):
                    if r.get(k) is not None and r[k] > (b.get(k) or 0):
                        b[k] = r[k]
        return best
    return max(got, key=lambda j: j["configs"]["c"]["tokens_per_s"])
def rate1(name):  # tokens/s over steps 2..N of a --log-json file
    tok = sec = 0.0
    try:
        for line in open(os.path.join(W, name)):
            r = json.loads(line)
            if "step" in r and r["step"] >= 2:
                tok += r["tokens"]; sec += r["seconds"]
    except (OSError, ValueError):
        return None
    return tok / sec if sec > 0 else None
def rate(stem):
    got = [v for v in (rate1("%s_%d.jsonl" % (stem, i)) for i in range(1, rounds + 1)) if v]
    return max(got) if got else None
kline = "?"
try:
    kline = next(l.strip() for l in open(os.path.join(W, "notes_new_1.txt")) if l.lstrip().startswith("service:"))
except (OSError, StopIteration):
    pass
amx = "amx-bf16" in kline and "(emulated)" not in kline
rows = []  # (what, nightlora, peer, ratio, target, ok)
def add(what, ours, peer, ratio, target="", ok=None):
    rows.append((what, ours, peer, ratio, target, ok))
f = lambda v, fmt="%.1f": "-" if v is None else fmt % v
base_ok = []
def vs_base(what, new, old):
    if not has_base:
        return
    r = new / old if new and old else None
    ok = r is not None and r >= 0.95
    base_ok.append(ok)
    add(what + " vs base", f(new), f(old), f(r, "%.3fx"), ">= 0.95x (no row slower than base)", ok)
# proj
pn, pb, tp = load("proj_new") or [], load("proj_base") or [], load1("torch_proj.json") or {}
tg = tp.get("rows")
for i, r in enumerate(pn):
    best = max(r["host_gflops"], r.get("amx_gflops") or 0.0)
    name = "proj %s %dx%d %s T=%d (%s)" % (r["proj"], r["k"], r["n"], r["dir"], r["T"], r["compute"])
    if tg:
        ratio = best / tg[i]
        add(name + " vs PyTorch BF16", f(best) + " GF/s", f(tg[i]) + " GF/s", f(ratio, "%.2fx"),
            ">= 0.8x (AMX)" if amx else "", (ratio >= 0.8) if amx else None)
    else:
        add(name, f(best) + " GF/s", "PyTorch " + tp.get("error", "?"), "-")
    old = next((b for b in pb if (b["proj"], b["dir"], b["T"]) == (r["proj"], r["dir"], r["T"])), None)
    if has_base:
        vs_base(name, r["host_gflops"], old["host_gflops"] if old else None)
# step
sn, sb, ts = load("step_new"), load("step_base"), load1("torch_step.json") or {}
c = sn["configs"]["c"] if sn else None
if c and "tokens_per_s" in ts:
    r1, r2 = c["tokens_per_s"] / ts["tokens_per_s"], c["peak_rss_bytes"] / ts["peak_rss_bytes"]
    add("qwen3-0.6b step T=%d tokens/s vs PyTorch BF16" % T, f(c["tokens_per_s"]), f(ts["tokens_per_s"]), f(r1, "%.2fx"),
        ">= 2x (AMX)" if amx else "", (r1 >= 2.0) if amx else None)
    add("qwen3-0.6b step peak RSS vs PyTorch BF16", f(c["peak_rss_bytes"] / 1e9, "%.2f GB"), f(ts["peak_rss_bytes"] / 1e9, "%.2f GB"),
        f(r2, "%.2fx"), "<= 0.5x (AMX)" if amx else "", (r2 <= 0.5) if amx else None)
elif c:
    add("qwen3-0.6b step T=%d tokens/s" % T, f(c["tokens_per_s"]), "PyTorch " + ts.get("error", "?"), "-")
if c and sb:
    vs_base("qwen3-0.6b step tokens/s", c["tokens_per_s"], sb["configs"]["c"]["tokens_per_s"])
# qwen35
qn, qb = load("q35_new"), load("q35_base")
q = qn["configs"]["c"] if qn else None
if q:
    add("qwen35-0.8b step T=%d tokens/s" % T, f(q["tokens_per_s"]), "", "", ">= 150 (AMX)" if amx else "",
        (q["tokens_per_s"] >= 150) if amx else None)
    prof = q.get("profile", {})
    split = ", ".join("%s %.2f" % (k, v) for k, v in sorted(prof.items(), key=lambda kv: -kv[1]) if v >= 0.005)
    add("qwen35-0.8b profile (s/step)", "service %.2f, CPU %.2f" % (q.get("service_seconds", 0), q.get("cpu_seconds", 0)), split, "")
    if qb:
        vs_base("qwen35-0.8b step tokens/s", q["tokens_per_s"], qb["configs"]["c"]["tokens_per_s"])
# tagging
nr, sr = rate("notes_new"), rate("seq_new")
if nr and sr:
    add("train: tagging notes vs %d-token sequences (qwen3-0.6b)" % T, f(nr) + " tok/s", f(sr) + " tok/s", f(nr / sr, "%.2fx"),
        ">= 0.8x", nr / sr >= 0.8)
else:
    add("train: tagging notes vs %d-token sequences" % T, f(nr), f(sr), "-", ">= 0.8x", False)
if has_base:
    vs_base("train tagging notes tok/s", nr, rate("notes_base"))
    vs_base("train %d-token sequences tok/s" % T, sr, rate("seq_base"))
print("## Issue 13 rows (bench/engine_rows.sh%s)\n" % (" --quick: T=%d, not the targets' T=512" % T if quick else ""))
print("kernels: `%s`  " % kline)
print("CPU AMX flags: %s; %s targets; %d training steps; best of %d round%s; %s s\n" %
      (cpu or "none", "AMX" if amx else "non-AMX", steps, rounds, "" if rounds == 1 else "s", secs))
print("| row | nightlora | peer / base | ratio | target | met |")
print("|---|---|---|---|---|---|")
for what, ours, peer, ratio, target, ok in rows:
    print("| %s | %s | %s | %s | %s | %s |" % (what, ours, peer, ratio, target, "" if ok is None else ("yes" if ok else "**no**")))
if not amx:
    print("\nNo AMX here: the AMX targets are not evaluated%s." %
          ("" if has_base else "; give --base OLD_BIN for the 'no row slower than today' target"))
EOF
