#!/bin/sh
# No function of src/ over 120 lines without a comment saying why (the comment block just above
# it holds "Long (" and the reason). Prints each one found; exits 1 if any. A function is a
# block from a column-0 line ending in "{" (after its signature) to the next column-0 "}".
#   fn_length.sh SOURCE_ROOT [LIMIT]
set -u
root=${1:?usage: fn_length.sh SOURCE_ROOT [LIMIT]}
limit=${2:-120}
bad=0
for f in "$root"/src/*/*.c; do
    awk -v file="${f#"$root"/}" -v limit="$limit" '
        function is_comment(l) { return l ~ /^[ \t]*(\/\*|\*|\/\/)/ || l ~ /\*\/[ \t]*$/ }
        { line[NR] = $0 }
        start == 0 && /\{[ \t]*$/ && /\)[ \t]*\{[ \t]*$/ && !/=/ {
            # the signature starts at the last column-0 line at or above this one
            s = NR
            while (s > 1 && line[s] !~ /^[A-Za-z_]/) s--
            if (line[s] ~ /^(typedef|struct|enum|union|static const|const)[ \t]/ && line[s] !~ /\(/) next
            if (NR == s || line[s] ~ /^[A-Za-z_]/) { start = s; next }
        }
        start && /^\}/ {
            n = NR - start + 1
            if (n > limit) {
                why = 0
                for (k = start - 1; k > 0 && is_comment(line[k]); k--) if (line[k] ~ /Long \(/) why = 1
                if (!why) { printf "%s:%d: a function of %d lines without a comment saying why (\"Long (...\" above it)\n", file, start, n; bad = 1 }
            }
            start = 0
        }
        END { exit bad }
    ' "$f" || bad=1
done
[ $bad -eq 0 ] && echo "fn_length: every function of src/ over $limit lines says why"
exit $bad
