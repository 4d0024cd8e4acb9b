#!/bin/sh
# The README's examples run as printed: the shell blocks of "Training on your own model" (check,
# eval, train, eval with the adapter, merge) and "PEFT adapters" (export, eval and train from the
# PEFT directory, export back to GGUF) are taken out of README.md and run line by line, in a
# scratch directory that looks like the repository root (build/, examples/, tools/, tests/ link to
# the real ones), so a flag renamed, a file moved or a command that now fails breaks this test.
#
# usage: readme_examples.sh BUILD_DIR SOURCE_ROOT [tiny|real]
#   tiny (ctest readme_examples): $M is a synthetic model (nightlora mkmodel), so the flow runs in
#        seconds; real (.ci/run): $M is the README's SmolLM2-135M-Instruct file; exit 77 (skipped)
#        when it is not fetched.
# What is not run as printed, and why: `make build` (the build is given), tools/fetch-models.sh
# (no network: the file is there or the test skips), the `python -c "from peft import ..."` line
# (it downloads the base model from the Hugging Face hub; bench/peft_check.sh loads the export in
# PEFT); the PEFT block's placeholders ("their-peft-dir", "--data ...") are the directory the
# block's first line exported and the README's training data with --steps 2.
set -eu
build=$(cd "$1" && pwd)
root=$(cd "$2" && pwd)
mode=${3:-tiny}
real=~/.cache/nightlora/SmolLM2-135M-Instruct.Q4_1.gguf
if [ "$mode" = real ] && [ ! -f "$real" ]; then
  echo "SKIPPED: $real is not fetched (tools/fetch-models.sh): the README's real-model example is not run"
  exit 77
fi
work=$(mktemp -d "${TMPDIR:-/tmp}/nl_readme_XXXXXX")
trap 'rm -rf "$work"' EXIT
ln -s "$build" "$work/build"
for d in examples tools tests; do ln -s "$root/$d" "$work/$d"; done

# the first ``` block after the heading $1 that holds the text $2
block() {
  awk -v head="$1" -v want="$2" '
    index($0, head) == 1 { inside_sec = 1; next }
    inside_sec && /^## / { exit }
    inside_sec && /^```/ { if (inb) { if (index(buf, want)) { printf "%s", buf; exit } buf = ""; inb = 0 } else inb = 1; next }
    inb { buf = buf $0 "\n" }' "$root/README.md"
}
train=$(block "## Training on your own model" "nightlora train --model")
peft=$(block "## PEFT adapters" "export --model")
[ -n "$train" ] || { echo "README.md: no train block under '## Training on your own model'"; exit 1; }
[ -n "$peft" ] || { echo "README.md: no export block under '## PEFT adapters'"; exit 1; }

# the script: the blocks' lines (continuations joined), with the substitutions above
{
  echo "set -eu"
  printf '%s\n%s\n' "$train" "$peft" | awk '
    { line = line $0 }
    /\\$/ { sub(/\\$/, "", line); next }
    { print line; line = "" }' | while IFS= read -r l; do
    case "$l" in
      "make build"*|"tools/fetch-models.sh"*) echo "# (not run: $l)" ;;
      "python -c "*) echo "# (not run: $l)" ;;
      M=*)
        if [ "$mode" = real ]; then echo "$l"; else echo "M=\$PWD/tiny.gguf   # for: $l"; fi ;;
      *)
        printf '%s\n' "$l" | sed -e 's|their-peft-dir|my-adapter-peft|g' \
          -e 's|--data \.\.\. |--data examples/tagging-chat-train.jsonl --steps 2 |' ;;
    esac
  done
} >"$work/readme.sh"

cd "$work"
if [ "$mode" != real ]; then
  build/nightlora mkmodel --arch qwen3 --preset tiny --out tiny.gguf >/dev/null
fi
echo "== the README's commands as run (from $work)"
grep -v '^#' readme.sh | grep -v '^set ' | grep -v '^ *#' | grep -v '^$' | sed 's/^/  /'
n=$(grep -c 'build/nightlora' readme.sh)
[ "$n" -ge 8 ] || { echo "README.md: only $n nightlora commands found in its examples"; exit 1; }
if ! sh -x readme.sh >readme.log 2>&1; then
  echo "== a README command failed:"
  tail -n 30 readme.log
  exit 1
fi
for f in my-adapter.gguf merged.gguf my-adapter-peft/adapter_config.json continued.gguf theirs.gguf ckpt/run.json train-log.jsonl; do
  [ -s "$f" ] || { echo "the README's commands ran but wrote no $f"; tail -n 30 readme.log; exit 1; }
done
grep -q '^done after' readme.log || { echo "no 'done after' line from the README's train"; exit 1; }
echo "readme_examples ($mode): $n commands ran as printed; $(grep -c 'accuracy' readme.log) eval lines"
