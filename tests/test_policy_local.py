"""Tests of the local backend's generation loop: batching with prefix KV reuse equals
one-at-a-time generation, seeds, sampling parameters, stop and length, context limits."""

from __future__ import annotations

import pytest
import torch

from coevolve.config import PolicyConfig
from coevolve.policy.base import SamplingParams
from coevolve.policy import row_seed
from coevolve.policy.decoder import DecodeStats, Decoder, sample_next
from coevolve.policy.local import LocalPolicy
from coevolve.policy.prefix_cache import PrefixCache

TOOLS = [{"name": "ls", "description": "List files.", "parameters": {"type": "dict", "properties": {}}}]


@pytest.fixture(scope="module")
def policy():
    saved = torch.get_num_threads()
    torch.set_num_threads(1)  # see tests/test_rollout.py::one_thread
    yield LocalPolicy(PolicyConfig(model="tiny", max_context_tokens=1024))
    torch.set_num_threads(saved)


def convs(n):
    return [[{"role": "user", "content": "list the files " * (k + 1)}] for k in range(n)]


def meta(n, step=0):
    return [{"task_id": "t", "sample_idx": k, "turn": 0, "step": step} for k in range(n)]


def test_batched_cached_generation_equals_one_at_a_time(policy):
    sampling = SamplingParams(temperature=1.0, max_new_tokens=16, seed=3)
    policy.prefix_cache = PrefixCache(0)  # no reuse at all: the reference
    single = [policy.chat([c], [TOOLS], sampling, [m])[0].text for c, m in zip(convs(5), meta(5))]
    policy.prefix_cache = PrefixCache(100_000)
    gens = policy.chat(convs(5), [TOOLS] * 5, sampling, meta(5))
    batched = [g.text for g in gens]
    assert batched == single
    # one entry per row: its prompt + answer, which replaced its prompt and kept the prompt's logits
    assert len(policy.prefix_cache) == 5
    assert all(policy.prefix_cache.exact(g.prompt_ids) for g in gens)
    # Second step of every conversation: prompts extend the cached ones.
    longer = [
        c + [{"role": "assistant", "content": t}, {"role": "tool", "content": "[]"}] for c, t in zip(convs(5), batched)
    ]
    policy.prefix_cache = PrefixCache(0)
    single2 = [policy.chat([c], [TOOLS], sampling, [m])[0].text for c, m in zip(longer, meta(5, 1))]
    policy.prefix_cache = PrefixCache(100_000)
    policy.chat(convs(5), [TOOLS] * 5, sampling, meta(5))
    assert [g.text for g in policy.chat(longer, [TOOLS] * 5, sampling, meta(5, 1))] == single2


def test_lengths_stops_and_greedy(policy):
    gens = policy.chat(convs(3), [TOOLS] * 3, SamplingParams(temperature=0.0, max_new_tokens=5), meta(3))
    assert all(g.completion_tokens <= 5 and g.finish_reason in ("stop", "length") for g in gens)
    assert all(g.finish_reason == "stop" or g.completion_tokens == 5 for g in gens)
    again = policy.chat(convs(3), [TOOLS] * 3, SamplingParams(temperature=0.0, max_new_tokens=5), meta(3))
    assert [g.text for g in gens] == [g.text for g in again]
    out = policy.generate([[5, 6, 7], [8, 9]], SamplingParams(temperature=0.0, max_new_tokens=4), [1, 2])
    assert len(out) == 2 and all(f in ("stop", "length") for _, f in out)


def test_sampling_parameters():
    logits = torch.tensor([[0.0, 1.0, 5.0, 2.0]] * 3)
    gens = [torch.Generator().manual_seed(i) for i in range(3)]
    assert sample_next(logits, SamplingParams(temperature=0.0), gens)[0] == [2, 2, 2]
    tokens, logprobs = sample_next(logits, SamplingParams(temperature=1.0, top_p=0.01), gens)
    assert tokens == [2, 2, 2]
    # the behaviour log-prob is the temperature-scaled one, before top-p truncation
    assert logprobs == pytest.approx([torch.log_softmax(logits[0], -1)[2].item()] * 3, abs=1e-6)
    _, hot = sample_next(logits, SamplingParams(temperature=0.5, top_p=0.01), gens)
    assert hot == pytest.approx([torch.log_softmax(logits[0] / 0.5, -1)[2].item()] * 3, abs=1e-6)
    draws = {
        tok
        for i in range(50)
        for tok in sample_next(logits[:1] * 0, SamplingParams(temperature=1.0), [torch.Generator().manual_seed(i)])[0]
    }
    assert draws == {0, 1, 2, 3}
    skewed = torch.log(torch.tensor([[0.1, 0.0, 0.2, 0.7]]))
    gen = [torch.Generator().manual_seed(0)]
    counts = torch.bincount(
        torch.tensor([sample_next(skewed, SamplingParams(), gen)[0][0] for _ in range(3000)]), minlength=4
    )
    assert counts[1] == 0 and abs(counts[3] / 3000 - 0.7) < 0.04 and abs(counts[0] / 3000 - 0.1) < 0.03
    m = {"task_id": "t", "sample_idx": 0, "turn": 0, "step": 0}
    assert row_seed(1, m, 0) == row_seed(1, dict(m), 5) != row_seed(2, m, 0)
    assert row_seed(1, {**m, "sample_idx": 1}, 0) != row_seed(1, m, 0)


def test_context_overflow_is_reported_not_raised(policy):
    huge = [[{"role": "user", "content": "word " * 5000}]]
    (gen,) = policy.chat(huge, [TOOLS], SamplingParams(max_new_tokens=4, seed=0), meta(1))
    assert gen.finish_reason == "context_limit" and gen.prompt_tokens <= 1024 - 4


def test_weight_updates_invalidate_the_prefix_cache(policy):
    sampling = SamplingParams(temperature=0.0, max_new_tokens=4, seed=0)
    policy.chat(convs(2), [TOOLS] * 2, sampling, meta(2))
    assert policy.prefix_cache._entries
    with torch.no_grad():
        next(policy.model.parameters()).add_(0.0)  # an in-place update, as an optimizer step does
    assert policy._weights_version() != policy._cached_weights
    policy.chat(convs(1), [TOOLS], sampling, meta(1))
    assert len(policy.prefix_cache) == 1, "stale entries were dropped, only this call's prompt (+ answer) remains"


def test_generation_matches_a_naive_uncached_sampler(policy):
    """Cached prefixes, padding, the growing cache and grouped-KV attention change nothing:
    each row samples what a full forward pass per token would (same seeds)."""
    sampling = SamplingParams(temperature=1.0, max_new_tokens=10)
    prompts = [list(range(40, 40 + n)) for n in (30, 7, 19)]
    policy.prefix_cache.put(prompts[0][:20], policy._prefill(prompts[0][:20])[0])  # a partial hit

    def naive(ids: list[int], seed: int) -> list[int]:
        gen, out = torch.Generator().manual_seed(seed), []
        with torch.inference_mode():
            for _ in range(sampling.max_new_tokens):
                logits = policy.model(input_ids=torch.tensor([ids + out])).logits[:, -1]
                (tok,), _ = sample_next(logits, sampling, [gen])
                if tok in policy.stop_ids:
                    break
                out.append(tok)
        return out

    got = policy.generate(prompts, sampling, [5, 6, 7])
    assert [ids for ids, _ in got] == [naive(p, s) for p, s in zip(prompts, [5, 6, 7])]


def test_rows_joining_a_running_batch_generate_what_they_would_alone(policy):
    """Continuous batching: a row that joins while others are mid-answer, or after rows have
    left and the cache was trimmed, samples the same tokens as when generated by itself."""
    sampling = SamplingParams(temperature=1.0, max_new_tokens=12)
    prompts = [[5 + k, 6, 7, 8] * (3 + 4 * k) for k in range(4)]  # different lengths: left padding
    alone = [policy.generate([p], sampling, [100 + k])[0] for k, p in enumerate(prompts)]
    policy.prefix_cache.clear()
    decoder = Decoder(policy, sampling)
    decoder.add([(0, prompts[0], 100), (1, prompts[1], 101)])
    out = {}
    for _ in range(5):
        out.update((key, (ids, finish)) for key, ids, finish in decoder.step())
    decoder.add([(3, prompts[3], 103)])  # longer than every row in the batch: the cache widens
    out.update((key, (ids, finish)) for key, ids, finish in decoder.step())
    decoder.add([(2, prompts[2], 102)])
    while decoder:
        out.update((key, (ids, finish)) for key, ids, finish in decoder.step())
    assert [out[k] for k in range(4)] == alone
    assert decoder.cache is None and decoder.step() == []


def test_generated_answers_keep_their_token_ids(policy):
    """An assistant message the policy generated is rendered with the ids it was generated
    as, not re-tokenized: the next prompt extends the KV cached for prompt + answer."""
    tok = policy.tokenizer
    text = "list the files"
    spelled = [i for ch in text for i in tok.encode(ch, add_special_tokens=False)]  # one token per character
    assert tok.decode(spelled) == text and tok.encode(text, add_special_tokens=False) != spelled
    conv = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": text},
        {"role": "tool", "content": "[]"},
    ]
    sampling = SamplingParams(max_new_tokens=4)

    def contains(ids, part):
        return any(ids[i : i + len(part)] == part for i in range(len(ids) - len(part) + 1))

    policy._answers.clear()
    assert not contains(policy.render(conv, TOOLS, sampling).ids, spelled)
    assert policy.answer_text(spelled) == text
    assert contains(policy.render(conv, TOOLS, sampling).ids, spelled)
    # The prompt + answer KV cached after a generation is found by the next prompt.
    (gen,) = policy.chat([conv[:1]], [TOOLS], SamplingParams(temperature=1.0, max_new_tokens=8, seed=1), meta(1))
    first = policy.render(conv[:1], TOOLS, sampling).ids
    nxt = policy.render(conv[:1] + [{"role": "assistant", "content": gen.text}, conv[2]], TOOLS, sampling).ids
    assert gen.text and nxt[: len(first)] == first
    cached, _ = policy.prefix_cache.longest(nxt)
    assert cached >= len(first) + gen.completion_tokens - 1


def test_half_precision_generation_runs_on_a_copy_that_follows_the_weights():
    from coevolve.policy.local import generation_dtype

    tiny = LocalPolicy(PolicyConfig(model="tiny", max_context_tokens=1024))
    assert tiny.dtype == torch.float32 and tiny.runner is tiny.model, "auto: small models stay float32"
    assert generation_dtype("bfloat16", tiny.model, torch.device("cpu")) == torch.bfloat16
    half = LocalPolicy(PolicyConfig(model="tiny", max_context_tokens=1024, dtype="bfloat16"))
    sampling = SamplingParams(temperature=1.0, max_new_tokens=8, seed=5)
    runner = half.runner
    assert runner.dtype == torch.bfloat16 and half.model.dtype == torch.float32
    first = [g.text for g in half.chat(convs(3), [TOOLS] * 3, sampling, meta(3))]
    assert first == [g.text for g in half.chat(convs(3), [TOOLS] * 3, sampling, meta(3))]
    assert half.runner is runner and half.prefix_cache._entries
    with torch.no_grad():  # what an optimizer step does to the float32 weights
        for p in half.model.parameters():
            p.mul_(0.0)
    half.chat(convs(1), [TOOLS], sampling, meta(1))
    assert half.runner is not runner and all(not p.any() for p in half.runner.parameters())
    with pytest.raises(ValueError, match="policy.dtype"):
        PolicyConfig(dtype="int8").validate()


def test_lora_adapters_are_merged_into_the_generation_copy():
    """The trainer injects LoRA adapters into the policy's model; generation runs on a merged
    copy (no adapter modules, the same function) that follows the adapters' updates."""
    from coevolve.train.local import attach_lora

    pol = LocalPolicy(PolicyConfig(model="tiny", max_context_tokens=1024))
    peft = attach_lora(pol.model, 4, 8)
    with torch.no_grad():
        for name, p in peft.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.2)
    runner = pol.runner
    assert runner is not pol.model and not any(hasattr(m, "lora_A") for m in runner.modules())
    ids = torch.tensor([[5, 17, 42, 99, 7]])
    with torch.no_grad():
        torch.testing.assert_close(runner(ids).logits, peft(input_ids=ids).logits, rtol=1e-4, atol=1e-4)
        for name, p in peft.named_parameters():
            if "lora_B" in name:
                p.mul_(-1.0)  # an update of the adapters only
    pol.chat(convs(1), [TOOLS], SamplingParams(temperature=1.0, max_new_tokens=4, seed=1), meta(1))
    with torch.no_grad():
        torch.testing.assert_close(pol.runner(ids).logits, peft(input_ids=ids).logits, rtol=1e-4, atol=1e-4)
    assert pol.runner is not runner


def test_a_groups_identical_prompts_are_computed_once(policy):
    """GRPO samples of one task start from the same prompt: one prefill serves them all."""
    prompt = [5, 6, 7, 8] * 10
    sampling = SamplingParams(temperature=1.0, max_new_tokens=6)
    policy.prefix_cache.clear()
    alone = [policy.generate([prompt], sampling, [seed])[0] for seed in (1, 2, 3)]
    policy.prefix_cache.clear()
    policy.stats = DecodeStats()
    assert policy.generate([prompt] * 3, sampling, [1, 2, 3]) == alone
    assert policy.stats.prefill_tokens == len(prompt)


def test_torch_kernels_held_to_avx2_mean_no_native_bfloat16(monkeypatch):
    """``ATEN_CPU_CAPABILITY=avx2`` runs an AVX-512 box as an AVX2-only one: float32 generation."""
    from coevolve.policy.local import cpu_has_native_bf16

    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    assert not cpu_has_native_bf16()


def test_a_sequence_that_extends_a_cached_one_replaces_it_and_keeps_its_logits():
    """An episode's prompt, its answer, its next prompt: one entry, holding all three lookups."""
    cache = PrefixCache(1000)

    def kv(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        t = torch.arange(n, dtype=torch.float32).reshape(1, 1, n, 1)
        return [(t, -t)]

    prompt, answer, other = list(range(100, 130)), list(range(200, 210)), list(range(300, 340))
    cache.put(prompt, kv(30), logits=torch.tensor([1.0]))
    cache.put(other, kv(40), logits=torch.tensor([2.0]))
    cache.put(prompt + answer, kv(40))
    assert len(cache) == 2 and cache._tokens == 80
    ((k, v),) = cache.exact(prompt)[0]
    assert k.shape[2] == 30 and torch.equal(cache.exact(prompt)[1], torch.tensor([1.0]))
    assert cache.exact(prompt + answer) is None  # stored without logits
    assert cache.longest(prompt + answer + [7])[0] == 40
    # evicting the entry takes the logits it held with it
    cache.put(list(range(400, 1370)), kv(970))
    assert cache.exact(prompt) is None and cache.exact(other) is None and len(cache) == 1
