#!/bin/sh
# Do train's defaults learn a small personal dataset? On three small tasks of short labelled
# messages (examples/tagging-*: 440 notes, 5 labels, prompt/completion; bench/small_data/support-*:
# 300 tickets, 6 labels, prompt/completion; bench/small_data/reply-*: 160 messages, 4 labels,
# chat) with a real model (SmolLM2-135M-Instruct Q4_1 from tools/fetch-models.sh), each row's
# held-out accuracy (nightlora eval: the answer scored against the other labels):
#
#   base        no adapter
#   old         the defaults before the batch was sized to the data: --batch-tokens 4096 --epochs 1
#   sized-1ep   the batch sized to the data, --epochs 1
#   default     no --batch-tokens, --steps, --epochs or --lr: what a user gets
#   tuned       16 steps of 512 tokens at --lr 1e-3 --warmup 5 (a run tuned by hand for the task)
#
# The steps each run took and its held-out loss are printed beside the accuracy. Slow (minutes):
# not part of make test. docs/real-models.md §0c has the figures.
#
#   sh bench/small_data_defaults.sh [TASK...]     # tagging support reply (default: all three)
#
# Environment: BIN (build/nightlora), WORK (/tmp/nightlora-small-data), THREADS (1; the results
# are the same bits for any thread count), ROWS (base old sized-1ep default tuned), CPU (a
# wrapper each run goes through, e.g. /work/bin/cpu; default none). Exits 0 with a message when
# the model is not there.
set -e
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(dirname "$HERE")
BIN=${BIN:-$ROOT/build/nightlora}
WORK=${WORK:-/tmp/nightlora-small-data}
THREADS=${THREADS:-1}
ROWS=${ROWS:-base old sized-1ep default tuned}
CPU=${CPU:-}
M=${NL_MODEL_CACHE:-$HOME/.cache/nightlora}/SmolLM2-135M-Instruct.Q4_1.gguf
if [ ! -f "$M" ]; then
    echo "small_data_defaults: $M is not there (tools/fetch-models.sh fetches it): skipped"
    exit 0
fi
TASKS=${*:-tagging support reply}
mkdir -p "$WORK"
# the two generated tasks, checked against their generator (a changed script changes the figures)
python3 "$HERE/small_data/make_tasks.py" "$WORK/gen"
for f in support-train support-test reply-train reply-test; do
    cmp -s "$WORK/gen/$f.jsonl" "$HERE/small_data/$f.jsonl" || { echo "small_data_defaults: bench/small_data/$f.jsonl differs from make_tasks.py's" >&2; exit 1; }
done
printf '%-8s %-10s %6s %s\n' task row steps "held-out (nightlora eval)"
for task in $TASKS; do
    case $task in
    tagging) train=$ROOT/examples/tagging-train.jsonl test=$ROOT/examples/tagging-test.jsonl ;;
    support|reply) train=$HERE/small_data/$task-train.jsonl test=$HERE/small_data/$task-test.jsonl ;;
    *) echo "small_data_defaults: unknown task $task (tagging, support, reply)" >&2; exit 2 ;;
    esac
    for row in $ROWS; do
        case $row in
        base) flags=none ;;
        old) flags="--batch-tokens 4096 --epochs 1" ;;
        sized-1ep) flags="--epochs 1" ;;
        default) flags="" ;;
        tuned) flags="--steps 16 --batch-tokens 512 --lr 1e-3 --warmup 5" ;;
        *) echo "small_data_defaults: unknown row $row" >&2; exit 2 ;;
        esac
        a="$WORK/$task-$row.gguf"
        steps=0
        if [ "$flags" != none ]; then
            rm -f "$a"
            # shellcheck disable=SC2086
            $CPU "$BIN" train --model "$M" --data "$train" --out "$a" --threads "$THREADS" --thermal off $flags \
                >"$WORK/$task-$row.log" 2>&1 || { echo "small_data_defaults: $task $row: train failed:" >&2; tail -5 "$WORK/$task-$row.log" >&2; exit 1; }
            steps=$(sed -n 's/^done after \([0-9]*\)\/.*/\1/p' "$WORK/$task-$row.log")
            adapter="--adapter $a"
        else
            adapter=
        fi
        # shellcheck disable=SC2086
        res=$($CPU "$BIN" eval --model "$M" $adapter --data "$test" --threads "$THREADS" 2>"$WORK/$task-$row.eval.err" | tail -1)
        printf '%-8s %-10s %6s %s\n' "$task" "$row" "$steps" "$(echo "$res" | sed 's/^[^:]*: //')"
    done
done
