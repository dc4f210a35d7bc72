#!/usr/bin/env bash
# verl's first launch, smoke-tested on ONE GPU node of the GPU image (infra/worker-gpu.Dockerfile):
# one verl GRPO step of 2 tasks x 4 samples on SmolLM2 with coevolve's agent loop, then the checks
# a real round depends on, in at most 10 minutes: each step has a timeout, and the ceilings add up
# to 600 s (the verl step's 300 s hold the seed pool, the SFT warm start, vLLM's and FSDP's start,
# the step, the checkpoint and its merge). Not yet run on a GPU: no GPU was at hand when it was written.
#
#   infra/gpu-smoke.sh --out smoke-out          # run it (the image's Python, a GPU, no network needed)
#   infra/gpu-smoke.sh --dry-run                # print every command it would run; run nothing
#
# Steps: (1) the node: torch sees a GPU, verl / vLLM / TransferQueue import, flash-attn or the sdpa
# fallback; (2) `coevolve train --dry-run`: verl's composed config and launch command (a round-0
# seed pool is synthesized into the store first if it has none); (3) the verl step itself (the
# SFT warm start of SmolLM2 runs first, locally); (4) the `rollouts` rows: 8 episodes of step 1 with
# sample_idx 0-3 per task, and the `train_steps` row from verl's metrics; (5) the merged checkpoint
# (LoRA folded in) loads and generates on the GPU; (6) signals mined from the rows; (7) the
# checkpoint evaluated on 2 held-out BFCL entries. OUT receives smoke.log and the store.
set -euo pipefail
cd "$(dirname "$0")/.."

usage() {
  cat <<'EOF'
usage: infra/gpu-smoke.sh [options]
  --out DIR       output folder: smoke.log and the store (default: gpu-smoke-out)
  --python PY     the Python of the GPU image (default: $PYTHON, else python3); the CLI is
                  $COEVOLVE (default: coevolve, on the image's PATH)
  --dry-run       print every command it would run, run nothing
  -h, --help      this help
EOF
}
die() {
  echo "gpu-smoke: $*" >&2
  exit 2
}

out=gpu-smoke-out py="${PYTHON:-python3}" dry_run=0
while [ "$#" -gt 0 ]; do
  case "$1" in
    --out) [ -n "${2:-}" ] || die "--out needs a value"; out=$2; shift 2 ;;
    --python) [ -n "${2:-}" ] || die "--python needs a value"; py=$2; shift 2 ;;
    --dry-run) dry_run=1; shift ;;
    -h | --help) usage; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done

store="$out/store"
run=smoke
config="$out/smoke.yaml"
# the smoke run's settings over configs/tiny.yaml (small synth/explore budgets): SmolLM2 with compact
# tool docs (BFCL's JSON docs would not fit its prompt budget), LoRA (the merge path), one GPU
settings='{
  "run_name": "smoke",
  "policy.model": "smollm2", "policy.tool_format": "compact", "policy.max_context_tokens": 4096,
  "policy.max_new_tokens": 96, "policy.device": "cuda",
  "train.backend": "verl", "train.steps": 1, "train.tasks_per_step": 2, "train.group_size": 4,
  "train.ppo_epochs": 1, "train.lora": True, "train.lr": 1e-5, "train.sft_steps": 30, "train.sft_lr": 5e-4,
  "train.verl_gpus_per_node": 1, "train.verl_nodes": 1,
  "train.verl_overrides": ["actor_rollout_ref.rollout.gpu_memory_utilization=0.4",
                           "actor_rollout_ref.rollout.enforce_eager=True"],
}'
coevolve=("${COEVOLVE:-coevolve}")

run() {  # run NAME TIMEOUT_S CMD...: print the command; run it unless --dry-run, logging to smoke.log
  local name=$1 limit=$2
  shift 2
  printf '+ [%s, %ss]' "$name" "$limit"
  local a
  for a in "$@"; do  # multi-line Python in single quotes, as pasted; the rest shell-quoted
    if [[ $a == *$'\n'* ]]; then printf " '%s'" "$a"; else printf ' %q' "$a"; fi
  done
  printf '\n'
  [ "$dry_run" = 1 ] && return 0
  local started=$SECONDS
  if ! timeout "$limit" "$@" 2>&1 | tee -a "$out/smoke.log"; then
    echo "gpu-smoke: step '$name' failed or ran past ${limit}s (see $out/smoke.log)" >&2
    exit 1
  fi
  echo "gpu-smoke: step '$name' done in $((SECONDS - started))s" | tee -a "$out/smoke.log"
}

[ "$dry_run" = 1 ] || { mkdir -p "$out"; : > "$out/smoke.log"; }
export PREFECT_SERVER_ANALYTICS_ENABLED=false DO_NOT_TRACK=1 PYTHONUNBUFFERED=1

run config 20 "$py" -c "
import dataclasses, yaml
from coevolve.config import load_config
cfg = load_config(\"configs/tiny.yaml\", $settings)
open(\"$config\", \"w\").write(yaml.safe_dump(dataclasses.asdict(cfg), sort_keys=False))
print(\"wrote $config\")
"
run node 40 "$py" -c "
import importlib.util, torch
assert torch.cuda.is_available(), \"torch sees no GPU: this smoke test needs one\"
import verl, vllm, transfer_queue
print(\"torch\", torch.__version__, \"cuda\", torch.version.cuda, torch.cuda.get_device_name(0))
print(\"verl\", verl.__version__, \"vllm\", vllm.__version__)
fa = importlib.util.find_spec(\"flash_attn\")
print(\"flash_attn:\", \"installed\" if fa else \"absent, verl runs on sdpa with remove-padding off\")
"
run dry-run 90 "${coevolve[@]}" train --dry-run --config "$config" --store "$store" --round 1
run train 300 "${coevolve[@]}" train --config "$config" --store "$store" --round 1
run rows 20 "$py" -c "
from coevolve.store import Store
store = Store(\"$store\")
rows = [r for r in store.read(\"rollouts\").to_pylist() if r[\"phase\"] == \"train\" and r[\"round\"] == 1]
episodes = {r[\"episode_id\"]: r for r in rows}
print(len(rows), \"rows,\", len(episodes), \"episodes\")
assert len(episodes) == 8, \"want 2 tasks x 4 samples\"
assert {(r[\"train_step\"], r[\"epoch\"]) for r in rows} == {(1, 0)}, \"verl step 1, epoch 0\"
per_task = {}
for r in episodes.values():
    per_task.setdefault(r[\"task_id\"], set()).add(r[\"sample_idx\"])
assert all(s == {0, 1, 2, 3} for s in per_task.values()), per_task
assert any(r[\"completion_logprobs\"] for r in rows), \"vLLM log-probs on the rows\"
steps = store.read(\"train_steps\").to_pylist()
print(\"train_steps:\", steps)
assert steps and steps[0][\"step\"] == 1, \"verl metrics in train_steps\"
"
run checkpoint 40 "$py" -c "
import os, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
path = \"$store/checkpoints/$run/round=1\"
assert not os.path.exists(os.path.join(path, \"lora_adapter\")), \"the LoRA adapter was merged\"
tok = AutoTokenizer.from_pretrained(path)
model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).cuda()
chat = [{\"role\": \"user\", \"content\": \"List my files.\"}]
ids = tok.apply_chat_template(chat, add_generation_prompt=True, return_tensors=\"pt\", return_dict=True)
out = model.generate(**{k: v.cuda() for k, v in ids.items()}, max_new_tokens=24, do_sample=False)
print(repr(tok.decode(out[0, ids[\"input_ids\"].shape[1]:])))
"
run signals 30 "${coevolve[@]}" signals --store "$store" --config "$config" --run "$run" --mine
run eval 60 "${coevolve[@]}" eval --config "$config" --store "$store" --policy "$store/checkpoints/$run/round=1" \
  --category multi_turn_base --limit 2 --run-id "$run" --round 1
[ "$dry_run" = 1 ] || echo "gpu-smoke: passed in ${SECONDS}s (log: $out/smoke.log)" | tee -a "$out/smoke.log"
