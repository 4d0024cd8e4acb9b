#!/bin/sh
# ctest install_example: the installed library as a program sees it.
#   sh tests/install_example.sh BUILD_DIR SOURCE_DIR
# Installs the build into a temporary prefix, builds examples/api_train.c against it with
# `pkg-config --cflags --libs nightlora` (shared) and against libnightlora.a alone (static), runs
# both, and checks that the shared library exports the public API only (nightlora_*) under the
# SONAME of the header's NIGHTLORA_ABI_VERSION. Exit 77 (skipped) without pkg-config or cc.
set -eu
B=$1
S=$2
for t in pkg-config cc nm readelf; do
  command -v "$t" >/dev/null 2>&1 || { echo "install_example: no $t here: skipped"; exit 77; }
done
P=$(mktemp -d "${TMPDIR:-/tmp}/nl_install.XXXXXX")
trap 'rm -rf "$P"' EXIT
fail() { echo "install_example: $*" >&2; exit 1; }

cmake --install "$B" --prefix "$P/prefix" >/dev/null
pc=$(find "$P/prefix" -name nightlora.pc)
[ -n "$pc" ] || fail "no nightlora.pc under the prefix"
PKG_CONFIG_PATH=$(dirname "$pc")
export PKG_CONFIG_PATH
libdir=$(pkg-config --variable=libdir nightlora)
[ -f "$libdir/libnightlora.so" ] && [ -f "$libdir/libnightlora.a" ] || fail "libnightlora.so / .a not in $libdir"
[ -f "$(pkg-config --variable=includedir nightlora)/nightlora.h" ] || fail "nightlora.h not installed"
[ -x "$P/prefix/bin/nightlora" ] || fail "the CLI not installed"

abi=$(sed -n 's/^#define NIGHTLORA_ABI_VERSION \([0-9]*\)$/\1/p' "$S/include/nightlora.h")
soname=$(readelf -d "$libdir/libnightlora.so" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
[ "$soname" = "libnightlora.so.$abi" ] || fail "SONAME '$soname', expected libnightlora.so.$abi"
# only the public API leaves the shared library (the C runtime's _init/_fini aside)
nm -D --defined-only "$libdir/libnightlora.so" | awk '{print $3}' | grep -v '^_init$\|^_fini$' | sort > "$P/exported"
n_exported=$(wc -l < "$P/exported")
other=$(grep -v '^nightlora_' "$P/exported" || true)
[ -z "$other" ] || fail "exported beyond the public API: $(echo "$other" | tr '\n' ' ')"
# ... and every function the header declares is exported
grep -o '^NL_API [^(]*(' "$S/include/nightlora.h" | sed 's/.*[ *]\([a-z_0-9]*\)($/\1/' | sort > "$P/declared"
missing=$(comm -23 "$P/declared" "$P/exported")
[ -z "$missing" ] || fail "declared in nightlora.h but not exported: $missing"
echo "install_example: $n_exported symbols exported, all nightlora_*; SONAME $soname"

# shared, through pkg-config (the header must stand alone: no -Isrc)
# shellcheck disable=SC2046
cc -std=c11 -Wall -Wextra -Wpedantic -Werror "$S/examples/api_train.c" $(pkg-config --cflags --libs nightlora) -o "$P/api_train"
LD_LIBRARY_PATH=$libdir "$P/api_train" "$S/examples/tagging-train.jsonl" "$S/examples/tagging-test.jsonl" "$P/work" > "$P/out"
cat "$P/out"
grep -q '^trained 4 steps (4 progress rows)' "$P/out" || fail "the shared-library example did not train 4 steps"
grep -q '^eval: 120 examples' "$P/out" || fail "the shared-library example did not evaluate"
# static: the same program against libnightlora.a
# shellcheck disable=SC2046
cc -std=c11 -Wall -Wextra -Werror "$S/examples/api_train.c" $(pkg-config --cflags nightlora) "$libdir/libnightlora.a" -lm -lpthread \
  -o "$P/api_train_static"
"$P/api_train_static" "$S/examples/tagging-train.jsonl" "$S/examples/tagging-test.jsonl" "$P/work-static" > "$P/out-static"
cmp "$P/out" "$P/out-static" >/dev/null 2>&1 || {
  # tok/s differs from run to run; everything else must agree
  sed 's/  [0-9]* tok\/s$//' "$P/out" > "$P/a"; sed 's/  [0-9]* tok\/s$//' "$P/out-static" > "$P/b"
  cmp "$P/a" "$P/b" || fail "the static build printed other results than the shared one"
}
cmp "$P/work/adapter.gguf" "$P/work-static/adapter.gguf" || fail "the static and shared builds trained other adapters"
echo "install_example: shared and static builds agree"
