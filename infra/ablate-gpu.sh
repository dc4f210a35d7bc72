#!/usr/bin/env bash
# Run the ablation ladder of configs/ablate-gpu.yaml on one GPU and collect what it shows:
#   infra/ablate-gpu.sh [OUT_DIR]        # default OUT_DIR: ./ablate-gpu-results
# OUT_DIR receives ablations.csv (one row per run x round), summary.csv (mean and spread per
# condition and round), the report's PNGs and report.md. Rerunning resumes finished runs.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-ablate-gpu-results}"
store="${COEVOLVE_ABLATE_STORE:-/data/coevolve/ablate-gpu}"
mkdir -p "$out"
export PREFECT_SERVER_ANALYTICS_ENABLED=false DO_NOT_TRACK=1
start=$(date +%s)
coevolve ablate --config configs/ablate-gpu.yaml --store "$store" | tee "$out/ablate.log"
echo "wall seconds: $(( $(date +%s) - start ))" | tee -a "$out/ablate.log"
coevolve sql --store "$store" --format csv "select * exclude (finished_at) from ablations order by condition, seed, round" > "$out/ablations.csv"
coevolve sql --store "$store" --format csv "$(cat sql/ablations/summary.sql)" > "$out/summary.csv"
coevolve report --store "$store" --out "$out"
