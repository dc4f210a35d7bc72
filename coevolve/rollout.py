"""The rollout engine: many multi-turn tool-calling episodes at once, one rollout row per step.

    results = run_episodes(policy, env, tasks, n_samples=4, sampling=SamplingParams(temperature=1.0),
                           step_limit=6, phase="train", run_id="demo", round=0)
    rows = [row for r in results for row in r.steps]          # -> store.write("rollouts", ...)

At most ``batch_size`` episodes are open at a time. Their requests for the next assistant
message go to the policy's generation stream (``coevolve.policy.base.GenerationStream``):
the local backend decodes all of them together in one KV cache and hands back each message
the moment it ends, so its episode acts in the environment and rejoins the batch with its
next prompt while the others are still generating (continuous batching); an endpoint runs
them as concurrent requests. When an episode ends, the next pending one takes its place, so
the batch stays full.

One turn: the user message (if any) is appended, then the model acts until it answers
without a tool call or has written ``step_limit`` messages in the turn. Every tool call is a
step with its own row (a message with three calls gives three rows, steps k, k+1, k+2); a
parse error is one step whose error text is shown to the agent as the observation; a plain
answer is the turn's last step. ``meta["step"]`` given to the policy is the index of the
model message within the turn.

Tokens: a model message's first row carries its exact ``prompt_ids``, sampled
``completion_ids`` and behaviour ``completion_logprobs`` (backends that return them: the
local one does), what the trainer optimizes; ``finish_reason = 'length'`` marks a message
the generation budget cut.

Rewards: every row of an episode carries the episode's ``episode_reward`` (the training reward of
``coevolve.reward``, with unparseable messages counted as malformed calls), its parts
``reward_progress`` / ``reward_format``, and ``success``;
``step_reward`` is 0 except on the last row of each turn, which carries ``1 / n_turns`` when
the benchmark passed that turn, so step rewards sum to the fraction of turns passed.

Randomness: each generation is seeded from (seed, phase, round, train_step, epoch, task,
sample, turn, step), so the same seed and batch size give the same rollouts, and another
batch size the same ones up to float rounding (see ``coevolve.policy.local``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from coevolve.envs.base import Environment, Episode
from coevolve.types import EpisodeScore, Observation, ToolCall
from coevolve.policy.base import Generation, Message, Policy, Request, SamplingParams, open_stream
from coevolve.policy.parsing import parse_tool_calls
from coevolve.policy.prompts import SYSTEM_PROMPT
from coevolve.reward import with_parse_errors
from coevolve.tasks import Task

if TYPE_CHECKING:
    from coevolve.config import RunConfig


@dataclass
class EpisodeResult:
    task_id: str
    sample_idx: int
    episode_id: str
    messages: list[Message]  # the whole chat: system, user, assistant (raw text), tool
    score: EpisodeScore
    steps: list[dict[str, Any]]  # rows of the `rollouts` table (coevolve.schemas.ROLLOUTS), in order
    n_generated_tokens: int
    tools: list[dict[str, Any]] = field(default_factory=list)  # schemas of the last turn (render with these)
    finish_reason: str | None = None  # why the episode was cut: context_limit | time_limit | error | step_limit


@dataclass
class _Run:
    """One open episode and what the engine tracks about it."""

    task: Task
    sample_idx: int
    episode_id: str
    ep: Episode | None = None
    messages: list[Message] = field(default_factory=list)
    tools: list[dict[str, Any]] = field(default_factory=list)
    turn: int = 0
    step: int = 0  # steps (rows) taken in the current turn
    generation: int = 0  # model messages in the current turn (what step_limit bounds)
    rows: list[dict[str, Any]] = field(default_factory=list)
    n_tokens: int = 0
    done: bool = False
    finish: str | None = None
    score: EpisodeScore | None = None


def _digest(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()


class _Engine:
    """Opens, advances and scores episodes; `run_episodes` schedules them."""

    def __init__(
        self,
        policy: Policy,
        env: Environment,
        *,
        sampling: SamplingParams,
        step_limit: int,
        base_row: dict[str, Any],
        step_timeout_s: float | None,
        system_prompt: str,
        parse_error_ends_turn: bool = False,
        step_limit_ends_episode: bool = False,
    ):
        self.policy, self.env = policy, env
        self.parse_error_ends_turn = parse_error_ends_turn
        self.step_limit_ends_episode = step_limit_ends_episode
        self.sampling, self.step_limit = sampling, step_limit
        self.base_row, self.step_timeout_s = base_row, step_timeout_s
        self.system_prompt = system_prompt
        self.pool = ThreadPoolExecutor(max_workers=4) if step_timeout_s else None

    # ---------------------------------------------------------------- episode lifecycle
    def open(self, run: _Run) -> _Run:
        run.messages.append({"role": "system", "content": self.system_prompt})
        try:
            run.ep = self.env.episode(run.task)
            self._begin_turn(run)
        except Exception as exc:  # a broken task must not take the whole batch down
            self.fail(run, "error", f"opening the episode failed: {type(exc).__name__}: {exc}")
        return run

    def _begin_turn(self, run: _Run) -> None:
        if run.turn >= run.ep.n_turns:
            run.done = True
            return
        text = run.ep.user_message(run.turn)
        if text:
            run.messages.append({"role": "user", "content": text})
        run.tools = run.ep.tools(run.turn)
        run.step = run.generation = 0

    def _end_turn(self, run: _Run) -> None:
        run.ep.end_turn()
        run.turn += 1
        self._begin_turn(run)

    def fail(self, run: _Run, finish: str, message: str) -> None:
        if run.rows:
            run.rows[-1]["finish_reason"] = finish
            run.rows[-1]["error"] = run.rows[-1]["error"] or message
        else:
            self._row(run, finish_reason=finish, error=message)
        run.done, run.finish = True, finish
        run.score = EpisodeScore(success=False, reward=0.0, reason=message)

    def meta(self, run: _Run) -> dict[str, Any]:
        """Where a conversation stands; ``step`` is the model message's index within the turn."""
        return {"task_id": run.task.task_id, "sample_idx": run.sample_idx, "turn": run.turn, "step": run.generation}

    # ---------------------------------------------------------------- one model step
    def _row(self, run: _Run, **values: Any) -> dict[str, Any]:
        row = {
            **self.base_row,
            "task_id": run.task.task_id,
            "episode_id": run.episode_id,
            "sample_idx": run.sample_idx,
            "turn": run.turn,
            "step": run.step,
            "action_name": None,
            "action_args": None,
            "observation": None,
            "parse_error": None,
            "error": None,
            "step_reward": 0.0,
            "episode_reward": None,
            "success": None,
            "n_tokens": 0,
            "finish_reason": None,
            "prompt_ids": None,
            "completion_ids": None,
            "completion_logprobs": None,
            **values,
        }
        run.rows.append(row)
        return row

    def _call_env(self, run: _Run, call: ToolCall) -> Observation:
        if self.pool is None:
            return run.ep.step(call)
        return self.pool.submit(run.ep.step, call).result(timeout=self.step_timeout_s)

    def advance(self, run: _Run, gen: Generation) -> None:
        """Apply one generation to its episode: log rows, run calls, end the turn when due.

        The message's first row carries its tokens (``n_tokens``, and where the backend returns
        them its exact ``prompt_ids``, ``completion_ids`` and ``completion_logprobs``) and
        ``finish_reason = 'length'`` when the generation budget cut it."""
        run.n_tokens += gen.completion_tokens
        run.generation += 1
        run.messages.append({"role": "assistant", "content": gen.text})
        first = {
            "n_tokens": gen.completion_tokens,
            "prompt_ids": gen.prompt_ids,
            "completion_ids": gen.completion_ids,
            "completion_logprobs": gen.completion_logprobs,
        }
        if gen.finish_reason == "length":
            first["finish_reason"] = "length"
        if gen.finish_reason == "context_limit":
            self._row(run, **first, finish_reason="context_limit")
            run.done, run.finish = True, "context_limit"
            return
        parsed = parse_tool_calls(gen.text)
        if parsed.error and self.parse_error_ends_turn:
            # BFCL: "Failed to decode the model response. Proceed to next turn." (no observation)
            self._row(run, parse_error=parsed.error, **first)
            run.step += 1
            self._end_turn(run)
            return
        if parsed.error:
            obs = f"Error: {parsed.error}"
            run.messages.append({"role": "tool", "content": obs})
            self._row(run, parse_error=parsed.error, observation=obs, **first)
            first = {}
            run.step += 1
        elif not parsed.calls:
            self._row(run, **first)
            reply = getattr(run.ep, "reply", None)  # the turn's text answer, for environments that score it
            if reply is not None:
                reply(gen.text)
            self._end_turn(run)
            return
        for call in parsed.calls:
            try:
                obs = self._call_env(run, call)
            except FutureTimeout:
                self._row(run, action_name=call.name, action_args=json.dumps(call.arguments), **first)
                self.fail(run, "time_limit", f"{call.name} took longer than {self.step_timeout_s}s")
                return
            except Exception as exc:
                self._row(run, action_name=call.name, action_args=json.dumps(call.arguments), **first)
                self.fail(run, "error", f"{call.name} raised {type(exc).__name__}: {exc}")
                return
            run.messages.append({"role": "tool", "name": call.name, "content": obs.content})
            self._row(
                run,
                action_name=call.name,
                action_args=json.dumps(call.arguments, default=str),
                observation=obs.content,
                error=obs.error,
                **first,
            )
            first = {}  # the message's tokens are counted once, on its first row
            run.step += 1
        if run.generation >= self.step_limit:
            # a message cut by the budget keeps 'length' (its row is the turn's last one only
            # when it made at most one call)
            if run.rows[-1]["finish_reason"] is None:
                run.rows[-1]["finish_reason"] = "step_limit"
            if self.step_limit_ends_episode and run.turn + 1 < run.ep.n_turns:
                # BFCL force-quits the entry: the turn is still checked, later turns never run
                run.ep.end_turn()
                run.turn += 1
                run.done, run.finish = True, "step_limit"
                return
            self._end_turn(run)

    # ---------------------------------------------------------------- scoring
    def finish(self, run: _Run) -> EpisodeResult:
        if run.score is None:
            try:
                run.score = run.ep.score()
            except Exception as exc:
                run.score = EpisodeScore(
                    success=False, reward=0.0, reason=f"scoring raised {type(exc).__name__}: {exc}"
                )
        # messages that could not be parsed never reached the environment: count them as malformed calls
        score = run.score = with_parse_errors(run.score, sum(1 for row in run.rows if row["parse_error"]))
        n_turns = max(1, getattr(run.ep, "n_turns", 1) or 1)
        last_of_turn = {row["turn"]: i for i, row in enumerate(run.rows)}
        for row in run.rows:
            row["episode_reward"], row["success"] = float(score.reward), bool(score.success)
            row["reward_progress"], row["reward_format"] = score.progress, score.format
        if score.turn_passed:
            for turn, i in last_of_turn.items():
                if turn < len(score.turn_passed) and score.turn_passed[turn]:
                    run.rows[i]["step_reward"] = 1.0 / n_turns
        elif run.rows:
            run.rows[-1]["step_reward"] = float(score.reward)
        return EpisodeResult(
            task_id=run.task.task_id,
            sample_idx=run.sample_idx,
            episode_id=run.episode_id,
            messages=run.messages,
            score=score,
            steps=run.rows,
            n_generated_tokens=run.n_tokens,
            tools=run.tools,
            finish_reason=run.finish,
        )


def rollout_settings(cfg: "RunConfig", phase: str) -> dict[str, Any]:
    """The keyword arguments of ``run_episodes`` that the run config sets for ``phase``.

    ``"eval"`` follows BFCL's protocol: ``eval.temperature`` (``policy.top_p`` only when it
    samples), ``eval.max_new_tokens``, ``eval.step_limit`` model messages per turn, a turn that
    reaches it ends the entry, and an undecodable message ends the turn. Any other phase
    (validation's attempts) samples as the policy does: ``policy.temperature``, ``top_p``,
    ``max_new_tokens`` and ``env.step_limit``. Both take the run's seed, ``policy.batch_size`` and ``env.step_timeout_s``.
    """
    p = cfg.policy
    if phase == "eval":
        e = cfg.eval
        top_p = p.top_p if e.temperature > 0 else 1.0
        sampling = SamplingParams(
            temperature=e.temperature, top_p=top_p, max_new_tokens=e.max_new_tokens, seed=cfg.seed
        )
        by_phase: dict[str, Any] = {
            "step_limit": e.step_limit,
            "parse_error_ends_turn": True,
            "step_limit_ends_episode": True,
        }
    else:
        sampling = SamplingParams(
            temperature=p.temperature, top_p=p.top_p, max_new_tokens=p.max_new_tokens, seed=cfg.seed
        )
        by_phase = {"step_limit": cfg.env.step_limit}
    return {
        "sampling": sampling,
        "batch_size": p.batch_size,
        "seed": cfg.seed,
        "step_timeout_s": cfg.env.step_timeout_s,
        **by_phase,
    }


def run_episodes(
    policy: Policy,
    env: Environment,
    tasks: list[Task],
    *,
    n_samples: int = 1,
    sampling: SamplingParams,
    step_limit: int,
    phase: str,
    run_id: str,
    round_no: int,
    train_step: int | None = None,
    epoch: int | None = None,
    batch_size: int = 8,
    seed: int = 0,
    step_timeout_s: float | None = None,
    progress: Callable[[int, int], None] | None = None,
    system_prompt: str = SYSTEM_PROMPT,
    parse_error_ends_turn: bool = False,
    step_limit_ends_episode: bool = False,
) -> list[EpisodeResult]:
    """Run ``n_samples`` episodes of every task; returns one result per episode, in task then sample order.

    Each sample is its own ``env.episode(task)``, so all samples of a task start from the same
    initial state. ``progress(done, total)`` is called as episodes finish.

    A message whose tool calls cannot be parsed gets an error observation and the turn goes on
    (training: the policy may correct itself within ``step_limit``); with
    ``parse_error_ends_turn`` it ends the turn instead, as BFCL's multi-turn protocol does
    ("Failed to decode the model response. Proceed to next turn."): evaluation uses that.
    A turn that reaches ``step_limit`` goes on to the next turn; with ``step_limit_ends_episode``
    it is checked and ends the episode (``finish_reason`` 'step_limit'), as BFCL force-quits an
    entry ("Model has been forced to quit after 20 steps"): the turns not run count as failed,
    so the entry fails unless that was its last turn. Evaluation uses that too.
    """
    if step_limit < 1 or batch_size < 1 or n_samples < 1:
        raise ValueError("step_limit, batch_size and n_samples must all be >= 1")
    where = (seed, phase, round_no, train_step, epoch)
    call_seed = sampling.seed if sampling.seed is not None else int(_digest(*where)[:15], 16)
    base_row = {
        "run_id": run_id,
        "round": round_no,
        "phase": phase,
        "train_step": train_step,
        "epoch": epoch,
        "policy_version": getattr(policy, "version", None),
    }
    engine = _Engine(
        policy,
        env,
        sampling=dataclasses.replace(sampling, seed=call_seed),
        step_limit=step_limit,
        base_row=base_row,
        step_timeout_s=step_timeout_s,
        system_prompt=system_prompt,
        parse_error_ends_turn=parse_error_ends_turn,
        step_limit_ends_episode=step_limit_ends_episode,
    )
    pending = deque(
        _Run(task=task, sample_idx=s, episode_id=f"{task.task_id}/s{s}/{_digest(run_id, *where, index)[:10]}")
        for index, task in enumerate(tasks)
        for s in range(n_samples)
    )
    total, results = len(pending), {}
    order = [(r.task.task_id, r.sample_idx, r.episode_id) for r in pending]
    active: list[_Run] = []
    in_flight: dict[str, _Run] = {}  # episode id -> run whose next message is being generated
    stream = open_stream(policy, engine.sampling)
    try:
        while pending or active:
            while pending and len(active) < batch_size:
                active.append(engine.open(pending.popleft()))
            ready = [r for r in active if not r.done and r.episode_id not in in_flight]
            if ready:
                stream.submit([Request(r.episode_id, r.messages, r.tools, engine.meta(r)) for r in ready])
                in_flight.update((r.episode_id, r) for r in ready)
            for key, gen in stream.collect() if in_flight else []:
                run = in_flight.pop(key)
                try:
                    engine.advance(run, gen)
                except Exception as exc:  # environment bugs end that episode only
                    engine.fail(run, "error", f"{type(exc).__name__}: {exc}")
            for run in [r for r in active if r.done]:
                results[run.episode_id] = engine.finish(run)
                if progress:
                    progress(len(results), total)
            active = [r for r in active if not r.done]
    finally:
        stream.close()
        if engine.pool:
            engine.pool.shutdown(wait=False, cancel_futures=True)
    return [results[eid] for _, _, eid in order]
