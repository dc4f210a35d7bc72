#!/usr/bin/env bash
# Serve an S3 API on loopback with moto (what the tests use), and create a bucket.
#   bash infra/s3-local.sh [port] [bucket]      then:
#   export AWS_ENDPOINT_URL=http://127.0.0.1:5000 AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test
#   coevolve run --store s3://coevolve/runs
set -euo pipefail
port=${1:-5000}
bucket=${2:-coevolve}
here=$(cd "$(dirname "$0")/.." && pwd)
export AWS_ACCESS_KEY_ID=${AWS_ACCESS_KEY_ID:-test} AWS_SECRET_ACCESS_KEY=${AWS_SECRET_ACCESS_KEY:-test} AWS_REGION=${AWS_REGION:-us-east-1}
"$here/.venv/bin/moto_server" -H 127.0.0.1 -p "$port" &
pid=$!
trap 'kill $pid' EXIT INT TERM
for _ in $(seq 50); do curl -sf "http://127.0.0.1:$port" >/dev/null && break; sleep 0.2; done
"$here/.venv/bin/python" -c "import boto3; boto3.client('s3', endpoint_url='http://127.0.0.1:$port').create_bucket(Bucket='$bucket')"
echo "S3 on http://127.0.0.1:$port, bucket s3://$bucket (Ctrl-C to stop)"
wait $pid
