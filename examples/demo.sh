#!/bin/sh
# make demo: the main job on the shipped default. Grows with the project; see README.
set -e
BIN=${1:-build/nightlora}
echo "nightlora demo: the training pipeline is not built yet; showing the CLI."
"$BIN" help
