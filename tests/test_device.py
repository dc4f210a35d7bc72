"""Where the local backend's model lives (``policy.device``) and that the trainer feeds it batches
built on that device: the CUDA code paths, guarded on a CPU. A batch on another device than the
model fails with a message that says how to build it, not deep inside torch."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from coevolve.config import ConfigError, PolicyConfig, load_config
from coevolve.policy.local import LocalPolicy, policy_device
from coevolve.policy.models import resolve_model
from coevolve.train import sft
from coevolve.train.scoring import forward_backward, model_device, pack, plan, sampled_logprobs
from coevolve.train.sequences import TokenSequence


def _seqs() -> list[TokenSequence]:
    head = list(range(5, 45))  # a 40-token shared prompt: plan shares it (min_prefix 32)
    return [
        TokenSequence(ids=head + [50 + i, 60, 61 + i], mask=[0] * 40 + [1, 1, 1], logprobs=[-1.0] * 43)
        for i in range(3)
    ] + [TokenSequence(ids=[7, 8, 9, 10], mask=[0, 0, 1, 1], logprobs=[-1.0] * 4)]


@pytest.fixture(scope="module")
def model():
    return AutoModelForCausalLM.from_pretrained(resolve_model("tiny")).eval()


def test_policy_device_is_validated_and_defaults_to_auto():
    assert PolicyConfig().device == "auto"
    for ok in ("auto", "cpu", "cuda", "cuda:1"):
        PolicyConfig(device=ok).validate()
    for bad in ("gpu", "cuda:", "CPU", "mps"):
        with pytest.raises(ConfigError, match="policy.device"):
            PolicyConfig(device=bad).validate()
    assert load_config(None, {"policy.device": "cpu"}).policy.device == "cpu"


def test_policy_device_resolution(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert policy_device("auto") == torch.device("cpu") and policy_device("cpu") == torch.device("cpu")
    with pytest.raises(ConfigError, match="sees no CUDA GPU.*'cpu' or 'auto'"):
        policy_device("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert policy_device("auto") == torch.device("cuda") and policy_device("cuda:0") == torch.device("cuda:0")
    with pytest.raises(ConfigError, match="sees 1 CUDA GPU"):
        policy_device("cuda:1")


def test_local_policy_follows_the_config_and_refuses_a_missing_gpu(monkeypatch):
    policy = LocalPolicy(PolicyConfig(model="tiny", device="cpu", max_context_tokens=256))
    assert policy.device == torch.device("cpu") == model_device(policy.model)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match="policy.device is 'cuda'"):
        LocalPolicy(PolicyConfig(model="tiny", device="cuda"))


def test_batches_are_built_on_the_requested_device(model):
    device = model_device(model)
    chunks = plan(_seqs(), 0, [1.0] * 4, share_prefix=True, min_prefix=32, device=device)
    assert any(c.prefix for c in chunks) and any(not c.prefix for c in chunks)  # both paths
    for chunk in chunks:
        for batch in chunk.batches:
            tensors = [v for v in batch.values() if isinstance(v, torch.Tensor)]
            assert tensors and all(t.device == device for t in tensors)
        forward_backward(model, chunk, 1.0, None)
    # a device other than the CPU (meta: shapes only, no data) is honoured by every tensor
    meta = pack(_seqs(), 0, [1.0] * 4, device="meta")
    assert {v.device.type for v in meta.values() if isinstance(v, torch.Tensor)} == {"meta"}
    assert meta["attention_mask"] is not None  # the padded batch's mask too


def test_a_batch_on_another_device_fails_clearly(model):
    batch = pack(_seqs(), 0, device="meta")
    with pytest.raises(ValueError, match=r"batch is on meta and the model on cpu.*model_device"):
        sampled_logprobs(model, batch)


def test_sft_plans_its_batches_on_the_models_device(model, monkeypatch):
    seen = []

    def spy(*args, **kwargs):
        seen.append(kwargs.get("device"))
        return plan(*args, **kwargs)

    monkeypatch.setattr(sft, "plan", spy)

    class Tok:
        pad_token_id, eos_token_id = 0, 0

    examples = [(s.ids, s.mask) for s in _seqs()]
    losses = sft.run_sft(model, Tok(), examples, steps=1, batch_size=2, lr=1e-4, seed=0)
    assert len(losses) == 1 and seen == [model_device(model)]
