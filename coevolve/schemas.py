"""Arrow schemas of every table coevolve writes: the contract between stages.

Every table is stored as hive-partitioned Parquet,
``tables/<name>/round=<r>/<part>.<token>.parquet`` (the parts each partition's manifest
records, see ``coevolve.store``); the ``round`` column lives in the partition path, so it is
*not* part of the file schemas below (readers add it back). JSON-valued columns are UTF-8 strings holding JSON text, so
DuckDB can read them with ``json_extract``.

Grain of each table:

- ``tasks``         one task of the pool (seed or explored), partitioned by the round that created it
- ``pool_versions`` one committed pool version
- ``rollouts``      one step of one episode (train / eval / explore / validate)
- ``signals``       one feedback signal mined in a round
- ``explorations``  one step of one exploration run
- ``candidates``    one abstracted task and its validation verdict
- ``rounds``        the metrics of one round (stage timings, rates, counts)
- ``ablations``     one round of one run (condition x seed) of an ablation (``coevolve ablate``)
- ``train_steps``   one optimizer step of the local GRPO trainer
"""

from __future__ import annotations

import pyarrow as pa

TASKS = pa.schema(
    [
        ("run_id", pa.string()),
        ("task_id", pa.string()),
        ("env", pa.string()),
        ("split", pa.string()),  # train | heldout (the held-out synthesized split: coevolve.heldout)
        ("origin", pa.string()),  # static (round 0, synthesized from training-scenario states) | explored | heldout
        ("category", pa.string()),  # e.g. multi_turn_base; synthesized tasks keep their seed's
        ("signal_type", pa.string()),  # forgetting | boundary | rare | random | null for seeds
        ("seed_task_id", pa.string()),  # the task whose state exploration started from
        ("turns", pa.list_(pa.string())),  # one user instruction per turn ("" = no user message)
        ("initial_state", pa.string()),  # JSON, environment specific
        ("tools", pa.list_(pa.string())),  # function names available to the agent
        ("reference_actions", pa.string()),  # JSON: per turn, a list of {"name", "arguments"}
        ("created_round", pa.int32()),
        ("content_hash", pa.string()),
    ]
)

POOL_VERSIONS = pa.schema(
    [
        ("run_id", pa.string()),
        ("version", pa.int32()),
        ("parent", pa.int32()),
        ("task_count", pa.int32()),
        ("added", pa.list_(pa.string())),
        ("removed", pa.list_(pa.string())),
        ("manifest", pa.string()),  # store key of the JSON manifest
        ("created_at", pa.timestamp("us", tz="UTC")),
    ]
)

ROLLOUTS = pa.schema(
    [
        ("run_id", pa.string()),
        ("phase", pa.string()),  # train | eval | explore | validate
        ("task_id", pa.string()),
        ("episode_id", pa.string()),  # unique per episode within (run_id, round, phase)
        ("sample_idx", pa.int32()),  # index within the task's group of samples
        ("train_step", pa.int32()),  # training step (null outside training)
        ("epoch", pa.int32()),
        ("turn", pa.int32()),
        ("step", pa.int32()),  # step within the turn
        ("action_name", pa.string()),  # null when the model answered without a call
        ("action_args", pa.string()),  # JSON
        ("observation", pa.string()),
        ("parse_error", pa.string()),  # null unless the model output could not be parsed
        ("error", pa.string()),  # null unless the call failed in the environment
        ("step_reward", pa.float64()),
        ("episode_reward", pa.float64()),  # training reward of the whole episode (coevolve.reward)
        ("success", pa.bool_()),  # episode success as the benchmark scores it
        ("n_tokens", pa.int32()),  # generated tokens of this step
        ("policy_version", pa.string()),
        ("reward_progress", pa.float64()),  # reward part: reference effects reproduced (null if the env has no parts)
        ("reward_format", pa.float64()),  # reward part: share of well-formed calls (null if the env has no parts)
        # null | length (the generation budget cut this message) | step_limit | time_limit | context_limit | error
        ("finish_reason", pa.string()),
        # the model message's exact tokens, on its first row (null elsewhere and for backends
        # that do not return them): the prompt as fed, the sampled ids (stop token included when
        # sampled; none added to a cut message), and each sampled id's behaviour log-prob under
        # log_softmax(logits / temperature) (coevolve.policy.base.Generation)
        ("prompt_ids", pa.list_(pa.int32())),
        ("completion_ids", pa.list_(pa.int32())),
        ("completion_logprobs", pa.list_(pa.float32())),
    ]
)

SIGNALS = pa.schema(
    [
        ("run_id", pa.string()),
        ("signal_id", pa.string()),
        (
            "signal_type",
            pa.string(),
        ),  # the signal file's name: forgetting | boundary | rare | uncertainty | reward_hacking | a user's
        ("task_id", pa.string()),  # null for pattern signals (rare)
        ("pattern", pa.string()),  # null for task signals
        ("score", pa.float64()),
        ("evidence", pa.string()),  # JSON
        ("is_new", pa.bool_()),  # false when an earlier round already explored it
        ("rank", pa.int32()),  # rank within its type (1 = highest score)
    ]
)

EXPLORATIONS = pa.schema(
    [
        ("run_id", pa.string()),
        ("signal_id", pa.string()),
        ("signal_type", pa.string()),
        ("context_task_id", pa.string()),
        ("run_idx", pa.int32()),
        ("step", pa.int32()),
        ("action_name", pa.string()),
        ("action_args", pa.string()),  # JSON
        ("observation", pa.string()),
        ("error", pa.string()),
    ]
)

CANDIDATES = pa.schema(
    [
        ("run_id", pa.string()),
        ("candidate_id", pa.string()),
        ("signal_id", pa.string()),
        ("signal_type", pa.string()),
        ("context_task_id", pa.string()),
        ("source_run", pa.int32()),
        ("spec", pa.string()),  # JSON task spec (a row of `tasks` as JSON)
        ("n_turns", pa.int32()),
        ("verdict", pa.string()),  # accepted | rejected
        ("reason", pa.string()),  # why (always set)
        ("reward", pa.float64()),  # best partial reward of the solver attempts
        ("success", pa.bool_()),
        ("content_hash", pa.string()),
        # how an accepted task passed: success (an attempt solved it) | partial (failed with
        # positive reward) | mechanical (round 0: pass 1 only); null for rejected rows
        ("pass_kind", pa.string()),
        # the nearest held-out benchmark turn (coevolve.contamination): its similarity in [0, 1]
        # and its id; null where the check did not run (a candidate rejected before it)
        ("contamination", pa.float64()),
        ("contamination_id", pa.string()),
    ]
)

ROUNDS = pa.schema(
    [
        ("run_id", pa.string()),
        ("policy_in", pa.string()),
        ("policy_out", pa.string()),
        ("pool_version", pa.int32()),
        ("pool_size", pa.int32()),
        ("n_rollouts", pa.int64()),
        ("train_reward", pa.float64()),
        ("train_success", pa.float64()),
        ("signals_forgetting", pa.int32()),
        ("signals_boundary", pa.int32()),
        ("signals_rare", pa.int32()),
        ("signal_counts", pa.string()),  # JSON {signal_type: count} over every signal file (user ones included)
        ("n_explorations", pa.int32()),
        ("n_candidates", pa.int32()),
        ("n_accepted", pa.int32()),
        ("pass_rate", pa.float64()),
        ("partial_share", pa.float64()),  # share of accepted tasks that passed by failure with positive reward
        ("warnings", pa.string()),  # JSON list of warnings of the round (reward hacking), null when none
        ("eval_score", pa.float64()),
        ("eval_reward", pa.float64()),
        ("synth_score", pa.float64()),  # success rate on the held-out synthesized split (null: none)
        ("synth_reward", pa.float64()),  # its mean reward (partial progress)
        ("t_train", pa.float64()),
        ("t_signals", pa.float64()),
        ("t_explore", pa.float64()),
        ("t_abstract", pa.float64()),
        ("t_validate", pa.float64()),
        ("t_commit", pa.float64()),
        ("t_evaluate", pa.float64()),
        ("t_total", pa.float64()),
        # where each stage's time went (coevolve.timing.SPLIT_COLUMNS); null where not measured
        ("t_train_load", pa.float64()),  # loading the policy (and attaching LoRA adapters)
        ("t_train_sft", pa.float64()),  # the SFT warm start
        ("t_train_rollouts", pa.float64()),  # sampling the GRPO groups and writing their rows
        ("t_train_update", pa.float64()),  # forward, backward and optimizer steps
        ("t_train_checkpoint", pa.float64()),  # merging adapters and saving the checkpoint
        ("t_validate_pass1", pa.float64()),  # dedup, safety, quality gate, reference replay
        ("t_validate_pass2", pa.float64()),  # the policy's attempts (loading it included)
        ("t_evaluate_load", pa.float64()),
        ("t_evaluate_prefill", pa.float64()),  # prompt tokens computed (local backend)
        ("t_evaluate_decode", pa.float64()),  # decoding steps (local backend)
        ("t_evaluate_rest", pa.float64()),  # environment steps and scoring, rendering, parsing
        ("finished_at", pa.timestamp("us", tz="UTC")),
    ]
)

ABLATIONS = pa.schema(
    [
        ("run_id", pa.string()),  # <condition>-s<seed>
        ("condition", pa.string()),  # zero-shot | static | random | signal-guided
        ("seed", pa.int32()),
        ("store", pa.string()),  # the run's own store (its pool lineage, rollouts, signals, ...)
        ("eval_score", pa.float64()),  # held-out success rate after the round (round 0: the base policy)
        ("eval_reward", pa.float64()),
        ("synth_score", pa.float64()),  # held-out synthesized split: success rate (null: none)
        ("synth_reward", pa.float64()),
        ("pool_size", pa.int32()),
        ("n_accepted", pa.int32()),
        ("pass_rate", pa.float64()),
        ("n_signals", pa.int32()),
        ("t_total", pa.float64()),  # seconds of the round's stages
        ("t_feedback", pa.float64()),  # seconds of signals + explore + abstract + validate
        ("finished_at", pa.timestamp("us", tz="UTC")),
    ]
)

TRAIN_STEPS = pa.schema(
    [
        ("run_id", pa.string()),
        ("step", pa.int32()),  # GRPO step of the round (1-based; one rollout batch)
        ("epoch", pa.int32()),  # inner PPO pass over the step's batch (0-based, < train.ppo_epochs)
        ("task_epoch", pa.int32()),  # pass over the round's tasks the step's tasks came from
        ("loss", pa.float64()),  # pg_loss + kl_coef * kl
        ("pg_loss", pa.float64()),  # clipped surrogate, token mean over the batch
        ("kl", pa.float64()),  # k3 KL to the round's starting policy, token mean (0 when kl_coef = 0)
        ("clip_frac", pa.float64()),  # share of trained tokens whose ratio left [1-eps, 1+eps]
        ("ratio_mean", pa.float64()),  # mean ratio to the behaviour policy over trained tokens
        ("grad_norm", pa.float64()),  # global gradient norm before clipping
        ("reward_mean", pa.float64()),  # episode rewards of the step's rollouts
        ("reward_std", pa.float64()),
        ("n_sequences", pa.int32()),  # training sequences (episodes with non-zero advantage, split where needed)
        ("n_tokens", pa.int64()),  # tokens of the training sequences
        ("n_trained_tokens", pa.int64()),  # sampled tokens with a loss
        ("n_computed_tokens", pa.int64()),  # tokens forwarded (a shared prompt counts once)
        ("n_attended_keys", pa.int64()),  # keys those tokens attend to (causal: position p reads p + 1)
        ("lr", pa.float64()),
        ("seconds", pa.float64()),  # wall time of this optimizer step (forward, backward, AdamW)
    ]
)

TABLES: dict[str, pa.Schema] = {
    "tasks": TASKS,
    "pool_versions": POOL_VERSIONS,
    "rollouts": ROLLOUTS,
    "signals": SIGNALS,
    "explorations": EXPLORATIONS,
    "candidates": CANDIDATES,
    "rounds": ROUNDS,
    "ablations": ABLATIONS,
    "train_steps": TRAIN_STEPS,
}


def to_table(name: str, rows: list[dict] | pa.Table) -> pa.Table:
    """Return ``rows`` as an Arrow table with exactly the schema of table ``name``.

    Missing columns become nulls; unknown columns are an error (they would silently
    vanish otherwise).
    """
    schema = TABLES[name]
    if isinstance(rows, pa.Table):
        extra = set(rows.column_names) - set(schema.names) - {"round"}
        if extra:
            raise ValueError(f"table {name!r} has no columns {sorted(extra)}")
        cols = [
            rows.column(f.name).cast(f.type) if f.name in rows.column_names else pa.nulls(len(rows), f.type)
            for f in schema
        ]
        return pa.Table.from_arrays(cols, schema=schema)
    for row in rows:
        extra = set(row) - set(schema.names) - {"round"}
        if extra:
            raise ValueError(f"table {name!r} has no columns {sorted(extra)}")
    return pa.Table.from_pylist([{k: r.get(k) for k in schema.names} for r in rows], schema=schema)
