#!/bin/sh
# Runs the analysis pipeline on the job's input directory.
set -eu
exec python3 /opt/analysis/pipeline.py "${INPUT_DIR:-/data/input}"
