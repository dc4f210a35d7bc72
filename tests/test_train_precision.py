"""``train.precision``: the local trainer's passes compute in bfloat16 (torch autocast) over
float32 weights where the policy samples in bfloat16, and give the float32 numbers up to
bfloat16 rounding; the SFT warm start and the GRPO update both run under it."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from coevolve.config import ConfigError, load_config
from coevolve.policy.models import resolve_model
from coevolve.store import Store
from coevolve.train import train_round
from coevolve.train.local import training_dtype
from coevolve.train.scoring import compute_precision, forward_backward, plan
from test_train_local import PickEnvironment, _config  # tests/ is on sys.path (registers "test-pick")
from test_train_prefix import _sequences


def test_auto_follows_the_generation_precision_and_bad_names_are_refused():
    tiny = AutoModelForCausalLM.from_pretrained(resolve_model("tiny"))
    # under 50M parameters 'auto' generates in float32 everywhere, so it trains in float32 too
    assert training_dtype("auto", tiny) == torch.float32
    assert training_dtype("bfloat16", tiny) == torch.bfloat16
    assert training_dtype("float32", tiny) == torch.float32
    with pytest.raises(ConfigError, match="train.precision must be"):
        load_config(None, {"train.precision": "float16"})


def _scored(model, dtype):
    model.zero_grad(set_to_none=True)
    seqs = _sequences()
    advs = [0.5, -1.0, 0.3, 1.0, -0.2, 0.8, 0.4]
    logps = []
    with compute_precision(dtype, model):
        for chunk in plan(seqs, 0, advs, micro_batch_size=1, share_prefix=True, min_prefix=16):
            logps += forward_backward(model, chunk, 1.0, lambda lp, b: -(lp * b["adv"]).sum())
    grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    return torch.cat(logps), grads


def test_bfloat16_scores_and_gradients_match_float32_up_to_rounding():
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(resolve_model("tiny")).eval()
    seen = []
    hook = model.get_decoder().layers[0].mlp.down_proj.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    logp32, grad32 = _scored(model, torch.float32)
    logp16, grad16 = _scored(model, torch.bfloat16)
    hook.remove()
    assert seen[0] == torch.float32 and seen[-1] == torch.bfloat16  # autocast did run the layers in bf16
    assert logp16.dtype == torch.float32 and all(p.dtype == torch.float32 for p in model.parameters())
    assert not torch.equal(logp16, logp32)
    assert (logp16 - logp32).abs().max() < 0.1  # rounding, not a different model
    assert torch.nn.functional.cosine_similarity(grad16, grad32, dim=0) > 0.99
    assert 0.8 < grad16.norm() / grad32.norm() < 1.2


def test_a_bfloat16_round_trains_both_sft_and_grpo_under_autocast(tmp_path, monkeypatch):
    import coevolve.train.local as local
    import coevolve.train.sft as sft

    entered: list[tuple[str, torch.dtype]] = []

    def spy(where):
        def enter(dtype, model):
            entered.append((where, dtype))
            return real(dtype, model)

        return enter

    real = local.compute_precision
    monkeypatch.setattr(local, "compute_precision", spy("grpo"))
    monkeypatch.setattr(sft, "compute_precision", spy("sft"))
    # an untrained tiny model earns the same reward on every sample: give the groups a spread
    monkeypatch.setattr(local, "group_advantages", lambda rewards, ids: torch.tensor([1.0, -1.0] * (len(rewards) // 2)))
    tasks = PickEnvironment().load_tasks(limit=8)
    cfg = _config(
        tmp_path,
        precision="bfloat16",
        sft_steps=2,
        steps=2,
        tasks_per_step=2,
        group_size=4,
        warm_start_cache=False,
        lr=1e-2,
    )
    result = train_round(Store(str(tmp_path / "store")), cfg, "pick", 1, "tiny", tasks)
    assert {dtype for _, dtype in entered} == {torch.bfloat16}
    assert [w for w, _ in entered].count("sft") == 2  # each SFT step
    steps = Store(str(tmp_path / "store")).read("train_steps").to_pylist()
    assert len(steps) == 2 and [w for w, _ in entered].count("grpo") == 2  # each GRPO update
    before = AutoModelForCausalLM.from_pretrained(resolve_model("tiny")).state_dict()
    after = AutoModelForCausalLM.from_pretrained(result.checkpoint).state_dict()
    assert all(v.dtype == torch.float32 for v in after.values())  # the checkpoint keeps float32 weights
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert all(torch.isfinite(v).all() for v in after.values())


def test_frozen_weights_are_cast_once_for_the_context_and_give_autocasts_numbers():
    from coevolve.train.local import attach_lora

    torch.manual_seed(0)
    model = attach_lora(AutoModelForCausalLM.from_pretrained(resolve_model("tiny")), 4, 8)
    base = model.get_base_model()
    proj = base.get_decoder().layers[0].self_attn.q_proj
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    # the plain autocast scores, every frozen weight cast at each use
    with torch.autocast("cpu", dtype=torch.bfloat16):
        plain = torch.cat([forward_backward(model, c, 1.0, None)[0] for c in plan(_sequences(), 0, share_prefix=False)])
    with compute_precision(torch.bfloat16, model):
        assert proj.base_layer.weight.dtype == torch.bfloat16  # frozen: one cast for the whole context
        assert proj.lora_A["default"].weight.dtype == torch.float32  # trained: autocast caches its cast
        assert base.get_output_embeddings().weight.dtype == torch.float32  # the head is scored in float32
        held = torch.cat([forward_backward(model, c, 1.0, None)[0] for c in plan(_sequences(), 0, share_prefix=False)])
    assert torch.equal(held, plain)
    after = dict(model.named_parameters())
    assert all(after[n].dtype == torch.float32 and torch.equal(after[n], p) for n, p in before.items())
