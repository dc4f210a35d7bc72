"""``coevolve train``: train the policy on the store's task pool once, outside the round flow;
``coevolve bench train``: local training throughput.

    coevolve train --config configs/tiny.yaml --store /tmp/cv             # local trainer
    coevolve train --config configs/bfcl_qwen_gpu.yaml --backend verl --dry-run
    coevolve bench train                    # trainer vs plain torch+peft, tiny and SmolLM2+LoRA; one GRPO step

``--dry-run`` (verl) writes the round's dataset and agent-loop files, composes and validates
verl's config, and prints it with the exact launch command, without launching anything.
The pool's train split is used; a store without a pool gets one seeded from the environment.
"""

from __future__ import annotations

import time

import typer

from coevolve.cli.app import app, bench_app
from coevolve.cli.common import console, fail, print_table


@app.command("train")
def train(
    config: str = typer.Option(None, "--config", "-c", help="YAML run config."),
    backend: str = typer.Option(None, "--backend", help="Trainer: local | verl (default: train.backend)."),
    store: str = typer.Option(None, "--store", help="Store URI (default: from the config)."),
    round: int = typer.Option(1, "--round", help="Round number the rollouts and checkpoint are filed under."),
    policy: str = typer.Option(None, "--policy", help="Starting policy (default: policy.model)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="verl: print the composed config and launch command only."),
    set_: list[str] = typer.Option([], "--set", help="Config override KEY=VALUE (repeatable)."),
) -> None:
    """Train the policy on the store's pool once (local or verl); --dry-run shows verl's config."""
    from coevolve.cli.common import parse_sets, preflight

    overrides = {**parse_sets(set_), "train.backend": backend, "store": store}
    cfg = preflight(config, overrides)
    from coevolve.round import open_run_store, pool_tasks, seed_pool

    run_store = open_run_store(cfg)
    if run_store.latest_pool() is None:
        seed_pool(run_store, cfg)
    tasks = pool_tasks(run_store, "train")
    if not tasks:
        fail(f"the pool in {cfg.store} has no train tasks")
    policy_in = policy or cfg.policy.model
    if dry_run:
        if cfg.train.backend != "verl":
            fail("--dry-run shows verl's launch; use it with --backend verl")
        from coevolve.train.verl_config import format_command
        from coevolve.train.verl_launch import prepare

        plan = prepare(cfg, cfg.run_name, round, policy_in, tasks)
        # plain echo: the command must stay one pasteable line, unwrapped
        typer.echo(plan.yaml)
        typer.echo(f"# files: {plan.workdir}")
        typer.echo(f"# launch command:\n{format_command(plan.command)}")
        return
    from coevolve.train import train_round

    started = time.monotonic()
    result = train_round(run_store, cfg, cfg.run_name, round, policy_in, tasks)
    console.print(
        f"trained {len(tasks)} tasks in {time.monotonic() - started:.0f}s: {result.n_rollouts} rollouts, "
        f"mean reward {result.mean_reward:.3f}, success {result.success_rate:.3f}\ncheckpoint: {result.checkpoint}"
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
) -> None:
    """The local trainer's update step next to a plain torch (+ peft) reference doing the same
    math on the same shapes (the tiny model with full fine-tuning, others with LoRA r=16), and
    one whole default GRPO step of SmolLM2 on synthesized BFCL tasks."""
    from rich.table import Table

    from coevolve.train.bench import measure_grpo_step, measure_update

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

    from coevolve.train.bench import sft_probe

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
