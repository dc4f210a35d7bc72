#!/usr/bin/env bash
# The same run on plain Ray (no Kubernetes): a head and GPU nodes started from the GPU image
#   head:    ray start --head --dashboard-host 0.0.0.0 --num-gpus 0
#   workers: ray start --address HEAD:6379
# then, from any machine with this repository and `ray` installed:
#   infra/ray/submit.sh http://HEAD:8265 [extra coevolve run arguments]
# Every node (and the head, where the run's driver starts) must mount the same directory at
# COEVOLVE_SHARED_DIR (default /mnt/coevolve): verl's round files and checkpoints go there.
set -euo pipefail
cd "$(dirname "$0")/../.."
address="${1:?usage: infra/ray/submit.sh http://HEAD:8265 [coevolve run arguments]}"
shift
ray job submit --address="$address" --working-dir . \
  --runtime-env-json '{"env_vars": {"PREFECT_SERVER_ANALYTICS_ENABLED": "false", "DO_NOT_TRACK": "1", "AWS_ENDPOINT_URL": "'"${AWS_ENDPOINT_URL:-}"'"}}' \
  -- coevolve run --config configs/bfcl_qwen_gpu.yaml --store "${COEVOLVE_STORE:-s3://coevolve/gpu}" \
     --set train.backend=verl --set train.verl_shared_dir="${COEVOLVE_SHARED_DIR:-/mnt/coevolve}" "$@"
