"""``coevolve bench ...``: the thin command-line wrappers of the benchmarks in ``coevolve.bench``
(options -> the bench function -> the figures printed). ``bench env`` sits beside ``coevolve eval``
(``coevolve/cli/eval.py``, whose accuracy table it prints); ``bench fanout`` in ``bench_fanout.py``.
``make bench`` runs the quick sizes of them all.

coevolve bench signals --rows 10000000          # SQL vs the pandas reference (exit 1 if they differ)
coevolve bench validate                         # 1,000 candidates vs a pool of 10,000
coevolve bench validate --set policy.model=tiny --policy tiny --solver-tasks 8
coevolve bench rollout                          # SmolLM2, 8 episodes, batch 8 (about 3 minutes)
coevolve bench rollout --model tiny --episodes 32          # the test model (seconds)
coevolve bench floor --store .coevolve/store    # the least time a run's model work can take here
coevolve bench train                            # trainer vs plain torch+peft, tiny and SmolLM2+LoRA; one GRPO step
coevolve bench sft                              # first calls before / after a LoRA SFT warm start
coevolve bench reliability                      # make chaos: kills, concurrency, S3 faults, fuzz
coevolve bench reliability --kills 3 --fuzz 20000 --scenarios kill,fuzz   # a quick look
coevolve bench safety                           # attacks refused, legitimate tasks refused with them
coevolve bench security --fast                  # every probe of issue 29: tried / held / failed
coevolve bench tasks --store .coevolve/store    # per round, with BFCL-V3's own entries beside
coevolve bench tasks --store S --no-yardstick --json f.json
coevolve bench tasks --store S --yardstick-limit 50        # a cheaper yardstick
coevolve bench tasks --store S --samples 10                # and 10 pool tasks, whole, drawn reproducibly

``bench reliability`` prints, per scenario, tried / survived / rows lost / rows duplicated /
corrupt pool versions, and exits with status 1 if any scenario lost, duplicated or corrupted
anything. ``bench tasks``: the figures are ``coevolve.bench.tasks.pool_report``'s (its docstring
defines each one); the yardstick column (default on for a BFCL-V3 pool) is printed, never
written: ``--json`` holds the pool's figures only.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from coevolve.cli.app import bench_app
from coevolve.cli.common import console, fail, load_config_or_fail, open_store_or_fail, parse_sets, print_table


@bench_app.command("signals")
def bench_signals(
    rows: int = typer.Option(10_000_000, "--rows", "-n", help="Step rows of the synthetic rollout log."),
    store: str = typer.Option("", "--store", help="Local directory to write the log into (default: a temporary one)."),
    rounds: int = typer.Option(4, help="Rounds in the log; the signals are mined for the last."),
    threads: int = typer.Option(0, help="DuckDB threads (0 = one per core)."),
    memory_limit: str = typer.Option("4GB", help="DuckDB memory limit."),
    pandas_max_rows: int = typer.Option(30_000_000, help="Skip the pandas reference above this many rows."),
    keep: bool = typer.Option(False, help="Keep the generated log (a temporary store is deleted otherwise)."),
) -> None:
    """Time the five built-in signal queries against a vectorized pandas reference on a synthetic log."""
    from coevolve.bench.signals import bench
    from coevolve.config import SignalsConfig

    directory = store or tempfile.mkdtemp(prefix="coevolve-bench-signals-")
    try:
        result = bench(
            rows,
            directory,
            rounds=rounds,
            cfg=SignalsConfig(threads=threads, memory_limit=memory_limit),
            pandas_max_rows=pandas_max_rows,
            echo=typer.echo,
        )
    finally:
        if not store and not keep:
            shutil.rmtree(directory, ignore_errors=True)
    if result["identical"] is False:
        raise typer.Exit(1)


@bench_app.command("validate")
def bench_validate(
    candidates: int = typer.Option(1000, "--candidates", "-n", help="Candidates to validate."),
    pool: int = typer.Option(10_000, "--pool", help="Tasks in the pool they are deduplicated against."),
    policy: str = typer.Option(
        None, "--policy", help="Policy checkpoint or model name for pass 2 (default: pass 1 only)."
    ),
    solver_tasks: int = typer.Option(16, help="Candidates the configured solver attempts in pass 2, for its rate."),
    config: str = typer.Option(None, "--config", "-c", help="Run config YAML (its validate/policy sections apply)."),
    sets: list[str] = typer.Option([], "--set", help="Override a config key, KEY=VALUE (e.g. validate.attempts=4)."),
) -> None:
    """Time the mechanical part of validation (dedup, safety, pass 1) on BFCL candidates, and pass 2's attempts/s."""
    from coevolve.bench.validate import bench

    cfg = load_config_or_fail(config, parse_sets(sets))
    bench(
        cfg,
        candidates=candidates,
        pool=pool,
        policy=policy,
        solver_tasks=solver_tasks,
        echo=lambda text: console.print(text, soft_wrap=True, highlight=False),
    )


@bench_app.command("rollout")
def bench_rollout(
    model: str = typer.Option("smollm2", help="'smollm2', 'tiny' or a local Hugging Face directory."),
    env_name: str = typer.Option("bfcl-v3", "--env", help="Environment plug-in."),
    category: str = typer.Option("multi_turn_base", help="Task category of the environment."),
    episodes: int = typer.Option(
        8, help="Episodes per mode (tasks x samples); 8 = the rollouts of one default GRPO step."
    ),
    samples: int = typer.Option(4, help="Samples per task (the group size)."),
    batch_size: int = typer.Option(8, help="Episodes generated together in the batched mode."),
    max_new_tokens: int = typer.Option(96, help="Generation budget per assistant message."),
    step_limit: int = typer.Option(3, help="Model messages per turn."),
    max_context_tokens: int = typer.Option(2048, help="Prompt + completion budget."),
    tool_format: str = typer.Option("compact", help="'compact' or 'json'."),
    dtype: str = typer.Option("auto", help="policy.dtype: 'auto', 'float32', 'bfloat16' or 'float16'."),
    threads: int = typer.Option(
        0,
        help="torch intra-op threads (0 = torch's default: one per core). 1 suits the tiny model, whose "
        "steps are too small to split across cores.",
    ),
    seed: int = typer.Option(0, help="Seed of the rollouts."),
    limits: bool = typer.Option(
        True,
        "--limits/--no-limits",
        help="Also run the batched run's first prompts through the engine, plain transformers generate() "
        "and the memory-bandwidth bound (decode and prefill tokens/s side by side).",
    ),
    limit_tokens: int = typer.Option(64, help="Tokens each prompt generates in the --limits comparison (>= 2)."),
) -> None:
    """Rollout engine throughput: batched vs one episode at a time, a same-seed replay check, and
    generation against transformers generate() and the bandwidth bound."""
    from coevolve.bench.rollout import bench
    from coevolve.config import PolicyConfig

    if episodes % samples:
        fail(f"--episodes ({episodes}) must be a multiple of --samples ({samples})")
    cfg = PolicyConfig(model=model, max_context_tokens=max_context_tokens, tool_format=tool_format, dtype=dtype)
    try:
        cfg.validate()
    except ValueError as exc:
        fail(str(exc))
    bench(
        cfg,
        env_name=env_name,
        category=category,
        episodes=episodes,
        samples=samples,
        batch_size=batch_size,
        max_new_tokens=max_new_tokens,
        step_limit=step_limit,
        threads=threads,
        seed=seed,
        with_limits=limits,
        limit_tokens=limit_tokens,
        echo=console.print,
    )


@bench_app.command("prompts")
def bench_prompts(
    store: str = typer.Option(..., "--store", help="Store of a run whose rollouts to read."),
) -> None:
    """Prompt tokens a prefix cache computes on a run's logged prompts, per round and phase:
    episodes' first prompts, prompts extending the one before, prompts recomputed after old
    messages were dropped."""
    from rich.table import Table

    from coevolve.bench.prompts import KINDS, prompt_costs

    rows = prompt_costs(open_store_or_fail(store))
    if not rows:
        fail(f"no logged prompts in {store}'s rollouts (a local backend logs them)")
    table = Table(
        "round", "phase", "prompts", "prompt tokens", *(f"{k}: prompts / computed" for k in KINDS), "computed"
    )
    for r in rows:
        computed = sum(r[f"{k} tokens"] for k in KINDS)
        table.add_row(
            str(r["round"]),
            r["phase"],
            str(r["prompts"]),
            f"{r['prompt_tokens']:,}",
            *(f"{r[k]} / {r[f'{k} tokens']:,}" for k in KINDS),
            f"{computed:,}",
        )
    print_table(table)


@bench_app.command("floor")
def bench_floor(
    store: str = typer.Option(..., "--store", help="Store of a run whose logged work to weigh."),
    model: str = typer.Option("smollm2", "--model", help="The run's policy.model (its weights count the FLOPs)."),
    precision: str = typer.Option(
        "auto",
        "--precision",
        help="Matrix products timed in: 'auto' (what policy.dtype 'auto' gives the model on this "
        "CPU: bfloat16 for a model of 50M+ weights on a CPU with native bf16, else float32), "
        "'float32' or 'bfloat16'.",
    ),
) -> None:
    """The least time a run's model work can take on this machine: per round and stage, the
    tokens the store says it computed, their FLOPs (projections, attention and sampled tokens'
    output head only: a lower bound) over the rate a large matrix product reaches here, beside
    the stage's measured time. The SFT warm start is not counted."""
    import torch
    from rich.table import Table

    from coevolve.bench.floor import stage_seconds, work_floor
    from coevolve.bench.limits import head_params, linear_params, matmul_flops
    from coevolve.policy.local import auto_dtype
    from coevolve.timing import machine_line

    if precision not in ("auto", "float32", "bfloat16"):
        fail(f"--precision must be 'auto', 'float32' or 'bfloat16', not {precision!r}")
    opened = open_store_or_fail(store)
    rows = work_floor(opened, model)
    if not rows:
        fail(f"no model work logged in {store} (no prompts in its rollouts, no train_steps)")
    dtype = (
        auto_dtype(linear_params(model) + head_params(model), torch.device("cpu"))
        if precision == "auto"
        else getattr(torch, precision)
    )
    precision = str(dtype).removeprefix("torch.")
    rate = matmul_flops(dtype)
    measured = stage_seconds(opened)
    updates_keyed = all(r["attended_keys"] or not r["update_tokens"] for r in rows if r["stage"] == "train update")
    table = Table(
        "round",
        "stage",
        "prefill tok",
        "decoded tok",
        "update tok",
        "TFLOP",
        "of it attention",
        "floor s",
        "took s",
        "took/floor",
    )
    totals = {"flops": 0.0, "attention": 0.0, "floor": 0.0, "took": 0.0}
    for r in rows:
        floor = r["flops"] / rate
        took = measured.get((r["round"], r["stage"]))
        totals["flops"] += r["flops"]
        totals["attention"] += r["attention_flops"]
        totals["floor"] += floor
        totals["took"] += took or 0.0
        table.add_row(
            str(r["round"]),
            r["stage"],
            *(f"{r[k]:,}" if r[k] else "-" for k in ("prefill_tokens", "decode_tokens", "update_tokens")),
            f"{r['flops'] / 1e12:.2f}",
            f"{r['attention_flops'] / 1e12:.2f}",
            f"{floor:.1f}",
            "-" if took is None else f"{took:.1f}",
            "-" if not took or not floor else f"{took / floor:.1f}x",
        )
    table.add_row(
        "all",
        "",
        "",
        "",
        "",
        f"{totals['flops'] / 1e12:.2f}",
        f"{totals['attention'] / 1e12:.2f}",
        f"{totals['floor']:.1f}",
        f"{totals['took']:.1f}",
        f"{totals['took'] / totals['floor']:.1f}x" if totals["floor"] else "-",
    )
    print_table(table)
    console.print(
        f"{machine_line()}; {precision} matrix products reach {rate / 1e9:.0f} GFLOP/s here, so this "
        f"work takes at least {totals['floor']:.0f} s ({totals['floor'] / 60:.1f} min) on this machine "
        "(SFT warm start, loading, the environment, norms and softmax not counted"
        + ("" if updates_keyed else "; nor the update's attention: this store's train_steps predate n_attended_keys")
        + ")"
    )


@bench_app.command("train")
def bench_train(
    models: list[str] = typer.Option(["tiny", "smollm2"], "--model", help="Models to measure (repeatable)."),
    steps: int = typer.Option(3, "--steps", help="Measured optimizer steps per model and side (after one warm-up)."),
    batch: int = typer.Option(4, "--batch", help="Sequences per step."),
    seq_len: int = typer.Option(256, "--seq-len", help="Tokens per sequence."),
    threads: int = typer.Option(0, "--threads", help="torch threads (0 = every core)."),
    whole_step: bool = typer.Option(
        True,
        "--whole-step/--no-whole-step",
        help="Also time the embedded default's first GRPO step of SmolLM2 (rollouts + update).",
    ),
    replay: str = typer.Option(
        "", "--replay", help="Store of a run: replay one of its logged GRPO updates instead (--round, --step)."
    ),
    round_no: int = typer.Option(1, "--round", help="With --replay: the round of the update."),
    step: int = typer.Option(1, "--step", help="With --replay: the GRPO step of the update."),
    profile: int = typer.Option(0, "--profile", help="With --replay: list this many costliest operations."),
) -> None:
    """The local trainer's update step next to a plain torch (+ peft) reference doing the same
    math on the same shapes (the tiny model with full fine-tuning, others with LoRA r=16), and
    one whole default GRPO step of SmolLM2 on synthesized BFCL tasks. With --replay, one
    update of a run instead, on its own logged rollouts (with SmolLM2, or the first --model)."""
    from rich.table import Table

    from coevolve.bench.train import measure_grpo_step, measure_update, replay_update

    if replay:
        # the run's model: the embedded default's unless --model names another
        name = "smollm2" if models == ["tiny", "smollm2"] else models[0]
        try:
            r = replay_update(
                open_store_or_fail(replay), round_no=round_no, step=step, model_name=name, profile=profile
            )
        except ValueError as exc:
            fail(str(exc))
        console.print(
            f"replayed update of round {round_no}, step {step} ({name}, {r['precision']}): "
            f"{r['seconds']:.1f}s for {r['n_sequences']} sequences of {r['n_tokens']:,} tokens, "
            f"{r['n_computed_tokens']:,} computed with shared prompts = "
            f"{r['n_computed_tokens'] / r['seconds']:,.0f} tokens/s" + (" (under the profiler)" if profile else "")
        )
        if profile:
            print(r["profile"])  # the profiler's own fixed-width table, unwrapped
        return

    table = Table(
        "model",
        "mode",
        "params trained",
        "batch x tokens",
        "threads",
        "trainer s/step",
        "plain torch s/step",
        "trainer / plain speed",
        "trainer tokens/s",
        "trainer bf16 s/step",
        "bf16 speed-up",
        "precision auto",
    )
    for name in models:
        lora = name != "tiny"
        m = measure_update(name, lora=lora, steps=steps, batch=batch, seq_len=seq_len, threads=threads)
        table.add_row(
            name,
            "LoRA r=16" if lora else "full",
            f"{m['trainable']:,}",
            f"{batch} x {seq_len}",
            str(m["threads"]),
            f"{m['trainer_s']:.2f}",
            f"{m['reference_s']:.2f}",
            f"{m['ratio']:.0%}",
            f"{m['tokens'] / m['trainer_s']:,.0f}",
            f"{m['trainer_bf16_s']:.2f}",
            f"{m['bf16_speedup']:.2f}x",
            m["auto"],
        )
    print_table(table)
    if whole_step:
        w = measure_grpo_step("smollm2", **({"train.threads": threads} if threads else {}))
        console.print(
            f"whole step: the embedded default's first GRPO step of SmolLM2 (LoRA, after its {w['sft_steps']}-step "
            f"SFT warm start; {w['episodes']} episodes on synthesized tasks, max_new_tokens {w['max_new_tokens']}, "
            f"ppo_epochs {w['ppo_epochs']}): {w['seconds']:.1f}s = rollouts {w['rollout_s']:.1f}s + update "
            f"{w['update_s']:.1f}s ({w['n_tokens']:,} tokens, {w['n_computed_tokens']:,} computed with shared "
            f"prompts {'on' if w['share_prefix'] else 'off'}); reward {w['reward']:.3f}; loading, warm start "
            f"and checkpoint {w['other_s']:.1f}s"
        )
        rate = w["update_flops"] / w["update_s"] if w["update_s"] else 0.0
        console.print(
            f"update against this machine's compute: at least {w['update_flops'] / 1e12:.2f} TFLOP (the projections, "
            f"forward and the activations' gradient) in {w['update_s']:.1f}s = {rate / 1e9:.0f} GFLOP/s, "
            f"{rate / w['matmul_flops']:.0%} of the {w['matmul_flops'] / 1e9:.0f} GFLOP/s a 1024^2 {w['precision']} "
            f"matrix product reaches here (measured in this run)"
        )


@bench_app.command("sft")
def bench_sft(
    model: str = typer.Option("smollm2", "--model", help="Model to warm-start."),
    steps: int = typer.Option(30, "--steps", help="LoRA SFT steps."),
    n_train: int = typer.Option(
        24,
        "--train",
        help="Synthesized tasks (round 0, half of its scenarios) whose reference trajectories are trained on.",
    ),
    n_heldout: int = typer.Option(
        12, "--heldout", help="First turns of synthesized tasks on the other scenarios, measured."
    ),
    batch: int = typer.Option(2, "--batch", help="Trajectories per SFT step."),
    lr: float = typer.Option(5e-4, "--lr", help="SFT learning rate."),
) -> None:
    """Does a short SFT warm start teach the model tool calls? First-call quality on held-out
    single-turn tasks synthesized on other scenarios (greedy), before and after LoRA SFT on the
    reference trajectories of synthesized tasks (round 0; BFCL questions are never read)."""
    from rich.table import Table

    from coevolve.bench.sft import sft_probe

    r = sft_probe(model, sft_steps=steps, n_train=n_train, n_heldout=n_heldout, batch=batch, lr=lr)
    table = Table("held-out first calls", "well-formed call", "offered function", "reference function")
    for label, q in (("zero-shot", r["before"]), (f"after {steps} SFT steps", r["after"])):
        table.add_row(label, f"{q['parsed']:.0%}", f"{q['valid']:.0%}", f"{q['correct']:.0%}")
    print_table(table)
    console.print(
        f"{r['n_examples']} reference trajectories, {r['mean_tokens']:.0f} tokens each on average; "
        f"SFT {r['sft_seconds']:.0f}s ({r['sft_seconds'] / max(steps, 1):.1f}s/step); "
        f"loss {r['losses'][0]:.2f} -> {r['losses'][-1]:.2f}; {r['after']['n']} held-out tasks"
    )


@bench_app.command("reliability")
def bench_reliability(
    scenarios: str = typer.Option(
        "kill,torn-writes,damaged-parts,damaged-parts-s3,concurrent-local,concurrent-s3,s3-faults,fuzz",
        help="Comma-separated scenarios.",
    ),
    config: str = typer.Option("configs/tiny.yaml", "--config", "-c", help="Run config of the kill and fault runs."),
    rounds: int = typer.Option(2, help="Rounds of each run of the kill, torn-writes and damaged-parts scenarios."),
    kills: int = typer.Option(20, help="SIGKILL points of the kill and torn-writes scenarios."),
    procs: int = typer.Option(4, help="Processes committing at once."),
    commits: int = typer.Option(5, help="Commits per process."),
    fault_rate: float = typer.Option(0.1, help="Share of S3 requests the proxy breaks (5xx, resets, stalls)."),
    fault_rounds: int = typer.Option(1, help="Rounds of the run through the faulty S3 proxy (0 = commits only)."),
    fuzz: int = typer.Option(1_000_000, help="Fuzzed model outputs through the parser and the dispatcher."),
    seed: int = typer.Option(0, help="Seed of the kill points, faults and fuzz."),
    workdir: str = typer.Option("", help="Where the campaign's stores go (default: a temporary directory)."),
    set_: list[str] = typer.Option([], "--set", help="Override a run config field of the runs: --set train.steps=2."),
) -> None:
    """Kill runs at random points, commit concurrently, break S3, fuzz model output; count losses."""
    from coevolve.bench.reliability.campaign import format_table, run_campaign
    from coevolve.bench.reliability.common import SMALL_RUN, CampaignConfig

    cc = CampaignConfig(
        scenarios=[s.strip() for s in scenarios.split(",") if s.strip()],
        config=config or None,
        overrides={**SMALL_RUN, **parse_sets(set_)},
        rounds=rounds,
        kills=kills,
        procs=procs,
        commits=commits,
        fault_rate=fault_rate,
        fault_rounds=fault_rounds,
        fuzz=fuzz,
        seed=seed,
        workdir=workdir,
    )
    results = run_campaign(cc, log=lambda line: console.print(line, markup=False, highlight=False, soft_wrap=True))
    print(format_table(results), flush=True)  # plain: never wrapped to the terminal's width
    if not all(r.ok for r in results):
        raise typer.Exit(1)


@bench_app.command("safety")
def bench_safety(
    envs: list[str] = typer.Option(["bfcl-v3", "agentdojo"], "--env", help="Environments whose round 0 is measured."),
    config: str = typer.Option(None, "--config", "-c", help="Run config YAML (its synth/validate sections apply)."),
    sets: list[str] = typer.Option([], "--set", help="Override a config key, KEY=VALUE (e.g. synth.scenarios=4)."),
    as_json: bool = typer.Option(False, "--json", help="Print the whole report as JSON."),
) -> None:
    """Run every AgentDojo injection task's ground truth through validation as a candidate, and
    measure the general safety rules' false refusals on each environment's round-0 tasks."""
    from coevolve.bench.safety import measure

    cfg = load_config_or_fail(config, parse_sets(sets))
    report = measure(cfg, envs)
    if as_json:
        typer.echo(json.dumps(report, indent=2))
        return
    a = report["attacks"]
    typer.echo(
        f"attacks (AgentDojo injection tasks as candidates): {a['refused']}/{a['candidates']} refused "
        f"({a['refused_by_safety']} by the safety policy); by rule: {a['by_rule']}"
    )
    if a["accepted_ids"]:
        typer.echo(f"  ACCEPTED: {a['accepted_ids']}")
    for name in envs:
        r = report[name]
        typer.echo(
            f"{name}: round-0 tasks accepted without the general rules: {r['tasks']}; refused by them: "
            f"{r['refused']} (false-refusal rate {r['rate']:.1%}); by rule: {r['by_rule']}"
        )


@bench_app.command("security")
def bench_security(
    fast: bool = typer.Option(False, "--fast", help="The quick form of every probe (.ci/run)."),
    areas: str = typer.Option("", "--areas", help="Comma-separated areas only: sql,store,stack,params,serve."),
    probes: str = typer.Option("", "--probes", help="Comma-separated probe names only."),
) -> None:
    """Try every attack and clumsy input of issue 29 on loopback against scratch stores; print
    tried / held / failed per probe, and exit 1 if any attempt got through."""
    from coevolve.bench.security import format_table, run_probes

    results = run_probes(
        fast=fast,
        areas=[a.strip() for a in areas.split(",") if a.strip()],
        names=[n.strip() for n in probes.split(",") if n.strip()],
        log=lambda line: console.print(line, markup=False, highlight=False, soft_wrap=True),
    )
    if not results:
        fail("no probe matches --areas/--probes")
    print(format_table(results), flush=True)  # plain: never wrapped to the terminal's width
    if any(r.failed for r in results):
        raise typer.Exit(1)


@bench_app.command("tasks")
def bench_tasks(
    store: str = typer.Option(".coevolve/store", "--store", "-s", help="Local directory or s3://bucket/prefix."),
    env_name: str = typer.Option("", "--env", help="Only this environment's tasks (default: every task of the pool)."),
    yardstick: Optional[bool] = typer.Option(
        None,
        "--yardstick/--no-yardstick",
        help="Print BFCL-V3 multi_turn_base's own figures beside the pool's (default: on for a bfcl-v3 pool).",
    ),
    yardstick_limit: int = typer.Option(200, help="BFCL entries the yardstick reads (0 = all 200)."),
    json_path: str = typer.Option("", "--json", help="Also write the pool's figures to this JSON file."),
    samples: int = typer.Option(0, help="Also print this many pool tasks whole, drawn with order by random()."),
    sample_seed: float = typer.Option(0.24, help="DuckDB setseed() of the draw, in [0, 1] (same seed, same tasks)."),
) -> None:
    """Share of the pool's training tasks passing the quality gate, per rule; turns, calls,
    state changes, reused results and function coverage, overall and per created round."""
    from coevolve.bench.tasks import bfcl_yardstick, pool_report, render, render_tasks, sample_tasks

    st = open_store_or_fail(store)
    if st.latest_pool() is None:
        fail(f"no committed pool in {store}")
    report = pool_report(st, env_name or None)
    if yardstick is None:
        yardstick = (env_name or "") == "bfcl-v3" or report["envs"] == ["bfcl-v3"]
    ys = bfcl_yardstick(yardstick_limit) if yardstick else None
    out = console if console.is_terminal else Console(width=240)  # pipes and logs get every cell
    render(report, ys, out)
    if json_path:
        Path(json_path).write_text(json.dumps(report, indent=1))  # the pool's figures only, never the yardstick's
        out.print(f"figures written to {json_path}", markup=False)
    if samples:
        out.print(f"\n{samples} tasks drawn with setseed({sample_seed}) and order by random():", markup=False)
        render_tasks(sample_tasks(st, samples, sample_seed), out)
