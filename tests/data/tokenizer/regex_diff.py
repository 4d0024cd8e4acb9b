#!/usr/bin/env python3
"""Differential check of the hand-written pre-tokenizer scanners against a regex engine.

Usage: python3 tests/data/tokenizer/regex_diff.py build/test_tokenizer [seed] [cases-per-pre]

Needs the third-party `regex` module (\\p{..} classes). Not part of `make test`: a developer tool.
Random strings over an alphabet of edge-case characters are split (1) by the pre-tokenizer
regexes of llama.cpp's llama-vocab.cpp, applied the way llama.cpp's unicode_regex_split applies
them (each regex cuts every current segment; text between matches is a segment; for regexes
written with literal ranges, non-ASCII whitespace is first replaced by U+000B), and (2) by
`test_tokenizer --pretok` (nl_pretokenize). Any difference is printed.
"""
import importlib.util
import os
import random
import subprocess
import sys

import regex

here = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location(
    "gen_unicode", os.path.join(here, "..", "..", "..", "tools", "gen_unicode.py"))
gen = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gen)

GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
CJK = "[" + "".join("%s-%s" % (chr(a), chr(b)) for a, b in gen.DS_CJK) + "]+"
DS_LETTER = r"\s?[" + "".join("%s-%s" % (chr(a), chr(b)) for a, b in gen.DS_LLM_LETTER) + "]+"
DS_PUNCT = r"\s?[" + "".join("%s-%s" % (chr(a), chr(b)) for a, b in gen.DS_LLM_PUNCT) + "]+"
PRE = {
    "gpt-2": [GPT2],
    "llama3": [r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"],
    "qwen2": [r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"],
    "qwen35": [r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"],
    "deepseek-llm": [r"[\r\n]", DS_LETTER, DS_PUNCT, r"\s+$", CJK, r"\p{N}+"],
    "deepseek-coder": [r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", CJK, r"\p{N}"],
    "falcon": [r"[\p{P}\$\+<=>\^~\|`]+", GPT2, r"[0-9][0-9][0-9]"],
    "starcoder": [r"\p{N}", GPT2],
    "default": [r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"],
}
WS = set(chr(c) for c in range(0x80, 0x3001) if regex.match(r"\s", chr(c)))


def split(pats, s):
    w = "".join("\x0b" if c in WS else c for c in s)
    segs = [(0, len(s))]
    for p in pats:
        t = s if "\\p{" in p else w
        out = []
        for a, b in segs:
            last = a
            for m in regex.finditer(p, t[a:b]):
                ms, me = a + m.start(), a + m.end()
                if ms > last:
                    out.append((last, ms))
                if me > ms:
                    out.append((ms, me))
                last = me
            if last < b:
                out.append((last, b))
        segs = out
    return [len(s[a:b].encode()) for a, b in segs]


ALPHA = list("aAbZ sS'tTmMlLdDvVrReE0123456789.,!?-+=<>$^~|`@#_\"()\n\r\t") + [
    "  ", "\n\n", " \n", "\u00e9", "\u0301", "\u0308", "\u4e16", "\u754c", "\uac00", "\u0939",
    "\u093f", "\u0902", "\u00a0", "\u3000", "\u2028", "\u0661", "\u00bd", "\u2160", "\U0001F600",
    "\u00b5", "\u0391", "\u03c9", "\u0416", "\u2019", "\uff01", "\u3001", "\u00ad", "\u200b",
    "\u212a", "\u0130", "\u1fbe", "\u0085"]


def main():
    binary = sys.argv[1]
    random.seed(int(sys.argv[2]) if len(sys.argv) > 2 else 1)
    per = int(sys.argv[3]) if len(sys.argv) > 3 else 3000
    cases = [(pre, "".join(random.choice(ALPHA) for _ in range(random.randint(0, 16))))
             for pre in PRE for _ in range(per)]
    inp = "".join("%s\t%s\n" % (p, s.encode().hex()) for p, s in cases)
    out = subprocess.run([binary, "--pretok"], input=inp.encode(), capture_output=True,
                         check=True).stdout.decode().split("\n")
    bad = 0
    for (p, s), o in zip(cases, out):
        got = [int(x) for x in o.split()] if not o.startswith("ERR") else None
        want = split(PRE[p], s)
        if got != want:
            bad += 1
            if bad <= 20:
                print("%s %r: got %s want %s" % (p, s, got, want))
    print("%d cases, %d mismatches" % (len(cases), bad))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
