#!/bin/sh
# docs/report.png: the report of `make demo`'s run, rendered by headless Chromium.
#   make demo && sh tools/report-png.sh [BIN] [LOG] [OUT.png]
# Chromium in a container needs --no-sandbox; the screenshot is cropped to the page (Pillow,
# Debian's python3-pil, when it is there).
set -e
BIN=${1:-build/nightlora}
LOG=${2:-out/demo/train-log.jsonl}
PNG=${3:-docs/report.png}
CHROMIUM=${NL_CHROMIUM:-$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)}
[ -n "$CHROMIUM" ] || { echo "report-png: no Chromium (install Debian's chromium, or set NL_CHROMIUM)" >&2; exit 1; }
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
RUN=$(dirname "$LOG")/checkpoints
set -- --log "$LOG" --out "$TMP/report.html" --title "make demo: a small Qwen3-shaped model learns the example tagging task"
[ -f "$RUN/run.json" ] && set -- "$@" --run "$RUN"
"$BIN" report "$@"
timeout 180 "$CHROMIUM" --headless --no-sandbox --disable-gpu --disable-dev-shm-usage --hide-scrollbars --no-first-run \
    --user-data-dir="$TMP/profile" --window-size=1000,4000 --screenshot="$TMP/shot.png" "file://$TMP/report.html" >/dev/null 2>&1
PY=
for p in python3 /usr/bin/python3; do "$p" -c "import PIL" 2>/dev/null && { PY=$p; break; }; done
if [ -n "$PY" ]; then
    "$PY" - "$TMP/shot.png" "$PNG" <<'END'
import sys
from PIL import Image, ImageChops
im = Image.open(sys.argv[1]).convert("RGB")
box = ImageChops.difference(im, Image.new("RGB", im.size, (255, 255, 255))).getbbox()
im.crop((0, 0, im.size[0], min(im.size[1], box[3] + 24))).save(sys.argv[2], optimize=True)
END
else
    cp "$TMP/shot.png" "$PNG"
fi
echo "wrote $PNG"
