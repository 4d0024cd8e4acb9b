#!/bin/sh
# The machine code of the AMX tile kernels, checked on any x86-64 build machine (the real tile
# instructions themselves run only on a CPU with AMX: tests/test_amx.c there).
#   1. every tile instruction (ldtilecfg, tileloadd, tdpbf16ps, ...) is in a function of
#      src/cpu/kernels_amx.c (real_*), which runs only after nl_amx_available() said yes: no
#      other code of the library or the CLI contains one (it would raise SIGILL on a CPU without AMX);
#   2. ldtilecfg reads the shared configuration object (nl_amx_config), never a stack slot: gcc
#      12's _tile_loadconfig declares only 8 bytes of its operand read, and a configuration built
#      in a local had its colsb/rows stores dropped as dead (ldtilecfg then read garbage).
# Usage: amx_code.sh BINARY... (the static library and the CLI). Exit 77: not checkable here.
set -u
command -v objdump > /dev/null 2>&1 || { echo "SKIPPED: no objdump"; exit 77; }
[ $# -ge 1 ] || { echo "usage: $0 BINARY..." >&2; exit 2; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/nl_amx_code.XXXXXX") || exit 2
trap 'rm -rf "$tmp"' EXIT INT TERM
fail=0
found=0
ins='ldtilecfg|sttilecfg|tileloadd|tileloaddt1|tilestored|tilezero|tilerelease|tdpbf16ps|tdpfp16ps|tdpbssd|tdpbsud|tdpbusd|tdpbuud'
for bin in "$@"; do
    bad=0
    case "$(uname -m)" in x86_64 | amd64) ;; *) echo "SKIPPED: not an x86-64 machine"; exit 77 ;; esac
    objdump -d --no-show-raw-insn "$bin" > "$tmp/d.txt" 2> "$tmp/err.txt" || { cat "$tmp/err.txt"; exit 2; }
    # "function: instruction operands" for every tile instruction
    awk -v re="^($ins)\$" '
        /^[0-9a-f]+ <[^>]*>:$/ { fn = $2; gsub(/[<>:]/, "", fn); next }
        NF >= 2 { if ($2 ~ re) print fn ": " $2 " " $3 }
    ' "$tmp/d.txt" > "$tmp/tile.txt"
    n=$(wc -l < "$tmp/tile.txt")
    [ "$n" -gt 0 ] && found=1
    if grep -v '^real_' "$tmp/tile.txt" > "$tmp/bad.txt"; then
        echo "FAIL: $bin: tile instructions outside the AMX kernels (src/cpu/kernels_amx.c):"
        sort -u "$tmp/bad.txt" | head -20
        bad=1
    fi
    if grep ': ldtilecfg ' "$tmp/tile.txt" | grep -E '%(rsp|rbp)' > "$tmp/bad.txt"; then
        echo "FAIL: $bin: ldtilecfg loads a configuration from the stack (a local the compiler may half-build):"
        cat "$tmp/bad.txt"
        bad=1
    fi
    [ "$bad" = 0 ] && echo "ok: $bin: $n tile instructions, all in real_* functions, ldtilecfg from memory"
    [ "$bad" = 0 ] || fail=1
done
if [ "$found" = 0 ]; then
    echo "SKIPPED: no tile instructions in these binaries (the compiler has no AMX target: NL_HAVE_AMX off)"
    exit 77
fi
exit "$fail"
