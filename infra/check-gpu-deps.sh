#!/usr/bin/env bash
# Do the project's dependency ranges admit a GPU image's stack, does the GPU image's requirement
# set (infra/requirements-gpu.txt, installed by infra/worker-gpu.Dockerfile in one step) resolve in
# one step, and does the Makefile path keep the CPU torch wheel? A resolution check only: nothing
# is installed, no CUDA wheel is downloaded (uv reads wheel metadata from PyPI).
#   infra/check-gpu-deps.sh [VENV_PYTHON]    # default: .venv/bin/python (what `make` builds)
# Needs uv (UV=/path/to/uv; e.g. python -m venv /tmp/uvenv && /tmp/uvenv/bin/pip install uv)
# and PyPI. Exits non-zero when a check that must resolve does not. Results: infra/README.md.
set -euo pipefail
cd "$(dirname "$0")/.."
py="${1:-.venv/bin/python}"
uv="${UV:-uv}"
command -v "$uv" >/dev/null || { echo "check-gpu-deps: uv not found (set UV=...)" >&2; exit 2; }
[ -x "$py" ] || { echo "check-gpu-deps: no python at $py (run make setup, or pass one)" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
compile() {  # compile NAME EXTRAS REQUIREMENT...: resolve pyproject (+ extras) + REQUIREMENTs for a GPU node
  local name=$1 extras=$2
  shift 2
  printf '%s\n' "$@" > "$tmp/$name.in"
  # shellcheck disable=SC2086
  if "$uv" pip compile pyproject.toml $extras "$tmp/$name.in" \
    --python-version 3.12 --python-platform x86_64-manylinux_2_28 --index-url https://pypi.org/simple \
    --no-header --no-annotate --quiet -o "$tmp/$name.txt" 2> "$tmp/$name.err"; then
    echo "$name: resolves: $(grep -iE '^(torch|transformers|verl|vllm|prefect|fastapi)==' "$tmp/$name.txt" | tr '\n' ' ')"
  else
    echo "$name: does not resolve: $(grep -m1 -o 'Because.*' "$tmp/$name.err")"
    return 1
  fi
}

echo "== Makefile path: torch==2.13.0 (CPU) first, then the project; pip must keep that torch"
"$py" -m pip install --dry-run -e '.[dev,verl,fanout,agentdojo]' > "$tmp/make.txt" 2>&1 || { cat "$tmp/make.txt"; exit 1; }
grep -E "^Would install|already satisfied: (torch|transformers)[<>=!,. 0-9]* in" "$tmp/make.txt" | sed 's| in /[^ ]*||'
if grep -E "^Would install" "$tmp/make.txt" | grep -qiE " (torch|transformers|nvidia-)"; then
  echo "FAIL: the Makefile path would replace torch or transformers" >&2
  exit 1
fi

echo "== a GPU node: Python 3.12, linux x86_64"
compile verl-gpu-pins "--extra verl" 'torch==2.11.0' 'transformers==5.9.0'  # verl[vllm]==0.9.1's torch and transformers
compile cuda-image "" 'torch==2.11.0' 'transformers==5.17.0'                # a CUDA image's stack, local trainer (no verl)
# vLLM 0.24 caps fastapi <0.137 and Prefect >=3.8 needs >=0.139: beside vLLM the resolver takes
# Prefect 3.7 (the project's floor, tested: infra/README.md).
compile verl-vllm "--extra verl" 'verl[vllm]==0.9.1' 'vllm==0.24.0'

echo "== the GPU image's requirement set in one resolve (infra/requirements-gpu.txt, Python 3.12)"
if "$uv" pip compile infra/requirements-gpu.txt \
  --python-version 3.12 --python-platform x86_64-manylinux_2_28 --index-url https://pypi.org/simple \
  --no-header --no-annotate --quiet -o "$tmp/image.txt" 2> "$tmp/image.err"; then
  echo "image: resolves, $(grep -c '==' "$tmp/image.txt") packages: $(grep -iE '^(torch|vllm|transformers|flash-attn|verl|transferqueue|nvidia-cuda-runtime|prefect)==' "$tmp/image.txt" | tr '\n' ' ')"
  grep -qiE '^flash-attn==' "$tmp/image.txt" || echo "image: flash-attn not in the set (verl's actor falls back to sdpa at launch)"
else
  echo "image: does not resolve: $(grep -m1 -o 'Because.*' "$tmp/image.err")"
  exit 1
fi
