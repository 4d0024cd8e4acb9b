#!/usr/bin/env python3
"""The training report in a real browser: headless Chromium renders `nightlora report` (a log
with pauses and validation rows) and `train --report` (a real run of a tiny model) to PNG
screenshots; the test checks every SVG parses as XML with the series it should hold, that the
page fetches nothing, and that the screenshots are not blank (non-white pixels, pixel variance,
the loss line's and the shaded pauses' colours), and a resumed run's report (its resume marker
drawn on every chart, at one x on the step charts). Exit 77 (ctest: skipped) when no Chromium is
found: set NL_CHROMIUM to its path, or install Debian's `chromium`.

usage: report_browser.py NIGHTLORA_CLI REPO_ROOT [OUT_DIR]   (OUT_DIR: keep the files there)"""
import math
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
import zlib

SKIP = 77
W, H = 1000, 3200


def find_chromium():
    env = os.environ.get("NL_CHROMIUM")
    if env:
        return env if os.access(env, os.X_OK) else None
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        p = shutil.which(name)
        if p:
            return p
    return None


def read_png(path):
    """(width, height, rows of (r, g, b) tuples). Pillow when it is there (Debian's python3-pil),
    else the small decoder below (8-bit RGB/RGBA/grey, not interlaced, every filter; slower)."""
    try:
        from PIL import Image
        im = Image.open(path).convert("RGB")
        w, h = im.size
        px = list(im.getdata())
        return w, h, [px[y * w:(y + 1) * w] for y in range(h)]
    except ImportError:
        return read_png_zlib(path)


def read_png_zlib(path):
    data = open(path, "rb").read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError(f"{path}: not a PNG")
    pos, idat, hdr = 8, b"", None
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        if zlib.crc32(kind + body) != struct.unpack(">I", data[pos + 8 + n:pos + 12 + n])[0]:
            raise ValueError(f"{path}: bad CRC in chunk {kind!r}")
        if kind == b"IHDR":
            hdr = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        elif kind == b"IEND":
            break
        pos += 12 + n
    w, h, depth, ctype, _, _, interlace = hdr
    chans = {0: 1, 2: 3, 4: 2, 6: 4}.get(ctype)
    if depth != 8 or chans is None or interlace:
        raise ValueError(f"{path}: PNG of depth {depth}, colour type {ctype}, interlace {interlace}: not decoded here")
    raw = zlib.decompress(idat)
    stride = w * chans
    prev = bytearray(stride)
    rows = []
    for y in range(h):
        f = raw[y * (stride + 1)]
        cur = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = cur[i - chans] if i >= chans else 0
            b = prev[i]
            c = prev[i - chans] if i >= chans else 0
            if f == 1:
                cur[i] = (cur[i] + a) & 255
            elif f == 2:
                cur[i] = (cur[i] + b) & 255
            elif f == 3:
                cur[i] = (cur[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                cur[i] = (cur[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        prev = cur
        if chans >= 3:
            rows.append([(cur[i], cur[i + 1], cur[i + 2]) for i in range(0, stride, chans)])
        else:
            rows.append([(cur[i], cur[i], cur[i]) for i in range(0, stride, chans)])
    return w, h, rows


def write_log(path):
    """A log as the trainer writes it: 150 steps, pauses in steps 40-41 and 100, validation
    every 25 steps with accuracy."""
    with open(path, "w") as f:
        for s in range(1, 151):
            paused = 6.0 if s in (40, 41, 100) else 0.0
            sec = 0.2 + 0.01 * (s % 5) + paused
            loss = 1.1 + 6.5 * math.exp(-s / 25) + 0.15 * math.sin(s * 1.7)
            lr = 2e-3 * min(1, s / 5) * (0.55 + 0.45 * math.cos(math.pi * s / 150))
            f.write('{"step": %d, "loss": %.17g, "tokens": %d, "targets": 41, "seconds": %.4f, "service_seconds": %.4f, '
                    '"paused_seconds": %.4f, "lr": %.17g, "grad_norm": %.17g}\n' % (s, loss, 240 + s % 3, sec, 0.09, paused, lr, 2 / math.sqrt(s)))
            if s % 25 == 0:
                f.write('{"eval": {"step": %d, "loss": %.6f, "accuracy": %.4f, "examples": 120, "tokens": 430, "seconds": 2.5}}\n'
                        % (s, 1.3 + 6 * math.exp(-s / 25), min(1.0, 0.2 + s / 180)))


def check_html(path, want):
    """Every <svg> parses as XML; the figures hold the series in want {figure id: [series]}."""
    html = open(path, encoding="utf-8").read()
    for bad in ("<script", "<link", "<img", "<iframe", "src=", "href=", "url(", "@import"):
        assert bad not in html, f"{path}: holds {bad}: the report must fetch nothing"
    figs = re.findall(r'<figure id="([^"]+)">\s*(<svg.*?</svg>)', html, re.S)
    assert len(figs) == html.count("<svg"), f"{path}: {html.count('<svg')} svg, {len(figs)} in figures"
    got = {}
    for fid, svg in figs:
        root = ET.fromstring(svg)  # raises on anything that is not well-formed XML
        assert root.tag.endswith("svg"), root.tag
        series = {e.get("data-series") for e in root.iter() if e.get("data-series")}
        drawn = [e for e in root.iter() if e.get("data-series") and (e.get("d") or len(e))]
        assert len(drawn) == len(series), f"{path}: figure {fid}: a series drawn empty"
        got[fid] = series
    for fid, series in want.items():
        assert fid in got, f"{path}: no figure {fid} (figures: {sorted(got)})"
        missing = set(series) - got[fid]
        assert not missing, f"{path}: figure {fid} lacks {sorted(missing)} (has {sorted(got[fid])})"
    print(f"{path}: {len(figs)} SVG charts parse as XML, series {sorted(set().union(*got.values()))}")
    return got


def near(p, rgb, tol):
    return all(abs(p[i] - rgb[i]) <= tol for i in range(3))


def check_png(path, colours):
    w, h, rows = read_png(path)
    assert (w, h) == (W, H), f"{path}: {w}x{h}, expected {W}x{H}"
    n = w * h
    nonwhite, s1, s2 = 0, 0.0, 0.0
    counts = {k: 0 for k in colours}
    for row in rows:
        for p in row:
            v = (p[0] + p[1] + p[2]) / 3
            s1 += v
            s2 += v * v
            if v < 245:
                nonwhite += 1
            for k, (rgb, tol) in colours.items():
                if near(p, rgb, tol):
                    counts[k] += 1
    var = s2 / n - (s1 / n) ** 2
    print(f"{path}: {w}x{h}, {100 * nonwhite / n:.1f}% non-white pixels, variance {var:.0f}, " +
          ", ".join(f"{k} {c} px" for k, c in counts.items()))
    assert nonwhite > 0.03 * n, f"{path}: {nonwhite} non-white pixels: blank"
    assert var > 100, f"{path}: pixel variance {var:.1f}: blank"
    for k, c in counts.items():
        assert c >= 150, f"{path}: only {c} pixels of {k}: not drawn"


def screenshot(chromium, html, png, profile):
    cmd = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--hide-scrollbars",
           "--no-first-run", "--user-data-dir=" + profile, "--window-size=%d,%d" % (W, H), "--screenshot=" + png,
           "file://" + os.path.abspath(html)]
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=180)
    if r.returncode != 0 or not os.path.exists(png):
        sys.stdout.write(r.stdout.decode(errors="replace")[-3000:])
        raise RuntimeError(f"chromium exited {r.returncode} without {png}")


def main():
    if len(sys.argv) < 3:
        print(__doc__)
        return 2
    cli, root = sys.argv[1], sys.argv[2]
    chromium = find_chromium()
    if not chromium:
        print("SKIPPED: no Chromium found (chromium, chromium-browser, google-chrome or NL_CHROMIUM): "
              "the report is not checked in a browser; install Debian's chromium to run this test")
        return SKIP
    out = sys.argv[3] if len(sys.argv) > 3 else tempfile.mkdtemp(prefix="nl_report_browser_")
    os.makedirs(out, exist_ok=True)
    profile = os.path.join(out, "profile")
    blue = ((0x2f, 0x6d, 0xb5), 30)           # the training loss (moving mean)
    pause = ((248, 220, 198), 8)              # #f4a261 at 0.35 over the plot's #fbfcfd
    val = ((0xd9, 0x73, 0x1a), 30)            # the validation loss points
    # 1. a log with pauses and validation rows
    log = os.path.join(out, "paused.jsonl")
    write_log(log)
    html = os.path.join(out, "paused.html")
    subprocess.run([cli, "report", "--log", log, "--out", html], check=True)
    check_html(html, {"loss": ["train-loss", "train-loss-mean", "val-loss"], "accuracy": ["val-accuracy"], "lr": ["lr"],
                      "throughput": ["tokens-per-s"], "step-time": ["service-s", "cpu-s"], "grad-norm": ["grad-norm"]})
    text = open(html, encoding="utf-8").read()
    assert text.count("<title>paused 6.0 s in step") == 3, "three paused steps shaded"
    png = os.path.join(out, "paused.png")
    screenshot(chromium, html, png, profile)
    check_png(png, {"loss line": blue, "validation points": val, "pause shading": pause})
    # 2. a real run: a tiny model trained a few steps, the report written by train --report
    model = os.path.join(out, "tiny.gguf")
    subprocess.run([cli, "mkmodel", "--arch", "qwen3", "--preset", "tiny", "--out", model], check=True, stdout=subprocess.DEVNULL)
    html2 = os.path.join(out, "run.html")
    subprocess.run([cli, "train", "--model", model, "--data", os.path.join(root, "examples", "tagging-train.jsonl"),
                    "--out", os.path.join(out, "a.gguf"), "--steps", "40", "--batch-tokens", "128", "--threads", "1", "--lr", "2e-3",
                    "--checkpoint-dir", os.path.join(out, "ck"), "--log-json", os.path.join(out, "run.jsonl"), "--report", html2,
                    "--quiet"], check=True)
    check_html(html2, {"loss": ["train-loss", "train-loss-mean"], "lr": ["lr"], "throughput": ["tokens-per-s"],
                       "step-time": ["service-s", "cpu-s"]})
    png2 = os.path.join(out, "run.png")
    screenshot(chromium, html2, png2, profile)
    check_png(png2, {"loss line": blue})
    # 3. a resumed run with validation: the resume's dashed marker drawn on every chart, at one
    # x on the five step charts (loss, accuracy, lr, gradient norm, time per step share the span)
    data = os.path.join(root, "examples", "tagging-train.jsonl")
    html3 = os.path.join(out, "resumed.html")
    for steps, extra in (("20", []), ("40", ["--resume", "--report", html3])):
        subprocess.run([cli, "train", "--model", model, "--data", data, "--out", os.path.join(out, "r.gguf"), "--steps", steps,
                        "--batch-tokens", "128", "--threads", "1", "--lr", "2e-3", "--val-data", os.path.join(root, "examples", "tagging-test.jsonl"), "--eval-every", "10",
                        "--checkpoint-dir", os.path.join(out, "ck3"), "--log-json", os.path.join(out, "resumed.jsonl"),
                        "--quiet"] + extra, check=True)
    check_html(html3, {"loss": ["train-loss", "val-loss"], "accuracy": ["val-accuracy"], "lr": ["lr"],
                       "throughput": ["tokens-per-s"], "step-time": ["service-s", "cpu-s"]})
    text = open(html3, encoding="utf-8").read()
    assert text.count('<g class="resume" data-x="20">') == 6, "the resume at step 20 on the six step charts"
    assert "changed: --steps 20 -&gt; 40" in text, "the resume's change listed"
    png3 = os.path.join(out, "resumed.png")
    screenshot(chromium, html3, png3, profile)
    red = ((0xb8, 0x32, 0x2a), 40)
    check_png(png3, {"loss line": ((0x2f, 0x6d, 0xb5), 30), "resume markers": red})
    w, h, rows = read_png(png3)
    cols = [0] * w
    for y in range(h):
        for x, p in enumerate(rows[y]):
            if near(p, red[0], red[1]):
                cols[x] += 1
    best = max(range(w - 1), key=lambda x: cols[x] + cols[x + 1])
    aligned = cols[best] + cols[best + 1]
    print(f"{png3}: resume markers: {sum(cols)} red px, {aligned} in columns {best}-{best + 1}")
    # five dashed lines of ~200 px at 5:3 on, ~125 px each, at the same x
    assert aligned >= 400, f"{png3}: the step charts' resume markers are not at one x ({aligned} px in the best column pair)"
    if len(sys.argv) <= 3:
        shutil.rmtree(out, ignore_errors=True)
    print("report_browser: passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
