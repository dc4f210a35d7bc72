"""Validation: the two passes (executable, learnable), duplicates, safety; and the
embedded-default round (rule explorer, template abstractor, BFCL) from 20 hand-built signals
to a committed pool."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter

import pyarrow.dataset as ds
import pytest

from coevolve.abstract import abstract
from coevolve.config import ConfigError, load_config
from coevolve.envs.base import ToolCall
from coevolve.envs.bfcl import BfclEnvironment
from coevolve.explore import explore, start_task
from coevolve.policy.replay import FINAL_TEXT, ReplayPolicy
from coevolve.safety import SafetyPolicy
from coevolve.schemas import to_table
from coevolve.tasks import Task
from coevolve.validate import (
    Attempts,
    _episode_solver,
    learnable,
    no_effect_turn,
    replay,
    summarize_candidates,
    validate,
    validate_rows,
)


@pytest.fixture(scope="module")
def env():
    return BfclEnvironment()


@pytest.fixture(scope="module")
def seed(env):
    return env.load_tasks(["multi_turn_base"], limit=1)[0]  # document/final_report.pdf, previous_report.pdf


def _candidate(seed, turns, reference, cid="c", **extra):
    task = dataclasses.replace(
        start_task(seed),
        task_id=f"{seed.task_id}~{cid}",
        turns=turns,
        reference_actions=reference,
        origin="explored",
        signal_type="boundary",
        seed_task_id=seed.task_id,
    )
    return {
        "run_id": "t",
        "candidate_id": cid,
        "signal_id": "s",
        "signal_type": "boundary",
        "context_task_id": seed.task_id,
        "source_run": 0,
        "spec": task.to_json(),
        "n_turns": len(turns),
        "content_hash": task.content_hash,
        **extra,
    }


CD = {"name": "cd", "arguments": {"folder": "document"}}
MK = {"name": "mkdir", "arguments": {"dir_name": "temp"}}
LS = {"name": "ls", "arguments": {}}
PWD = {"name": "pwd", "arguments": {}}


def test_each_check_rejects_with_its_reason(env, seed):
    pool = [dataclasses.replace(seed, split="train").to_row()]
    rows = [
        _candidate(seed, ["Go to document, make temp."], [[CD, MK]], "ok"),
        _candidate(seed, ["Go to document, make temp."], [[CD, MK]], "same"),  # batch duplicate of "ok"
        _candidate(seed, ["Go to document.", "Make temp."], [[CD], [MK]], "near"),  # same calls, other turns
        _candidate(seed, seed.turns, seed.reference_actions, "pooled"),  # the seed itself
        _candidate(seed, ["Delete it."], [[CD, {"name": "rm", "arguments": {"file_name": "final_report.pdf"}}]], "rm"),
        _candidate(seed, ["Post."], [[{"name": "post_tweet", "arguments": {"content": "my password is x"}}]], "leak"),
        _candidate(seed, ["Go nowhere."], [[{"name": "cd", "arguments": {"folder": "nowhere"}}]], "bad-call"),
        _candidate(seed, ["Call a ghost."], [[{"name": "ghost", "arguments": {}}]], "ghost"),
        _candidate(seed, ["List the files.", "List them again."], [[LS], [LS]], "repeat"),  # turn 1: nothing new
        {**_candidate(seed, ["x"], [[CD]], "broken"), "spec": '{"turns": ["x"]'},
        _candidate(seed, ["a", "b"], [[CD]], "mismatch"),
        {
            **_candidate(seed, ["x"], [[CD]], "judged"),
            "verdict": "rejected",
            "reason": "llm abstractor: malformed output",
        },
    ]
    cfg = load_config()
    out = {r["candidate_id"]: r for r in validate_rows(rows, pool, env, cfg, None)}
    assert out["ok"]["verdict"] == "accepted" and out["ok"]["reason"].startswith("accepted: pass 1")
    kinds = {cid: r["reason"].split(":")[0] for cid, r in out.items() if r["verdict"] == "rejected"}
    assert kinds == {
        "same": "duplicate",
        "near": "near-duplicate",
        "pooled": "duplicate",
        "rm": "unsafe",
        "leak": "unsafe",
        "bad-call": "wrong role",  # the quality gate: 'nowhere' is no folder of the state
        "ghost": "failing goal",  # the quality gate: a call to no function fails
        "repeat": "pass 1 no effect",
        "broken": "spec",
        "mismatch": "spec",
        "judged": "llm abstractor",
    }
    assert "blocked function rm" in out["rm"]["reason"] and "post_tweet.content" in out["leak"]["reason"]
    assert "'nowhere' is no known dir" in out["bad-call"]["reason"] and out["pooled"]["reason"].endswith(seed.task_id)
    assert out["repeat"]["reason"].startswith("pass 1 no effect: turn 1 (ls)")
    summary = summarize_candidates(to_table("candidates", list(out.values())))
    assert summary["accepted"] == 1 and summary["candidates"] == 12 and summary["pass_rate"] == round(1 / 12, 4)
    assert summary["rejections"]["unsafe"] == 2 and summary["rejections"]["wrong role"] == 1
    assert summary["rejections"]["failing goal"] == 1
    assert summary["rejections_by_pass"] == {"checks": 10, "pass 1": 1}
    assert summary["accepted_by_signal_type"] == {"boundary": 1} and summary["accepted_turns"] == {"1": 1}
    # the probe can be switched off: the repeated listing then passes pass 1
    lenient = load_config(overrides={"validate.require_effect": False})
    assert validate_rows([rows[8]], [], env, lenient, None)[0]["verdict"] == "accepted"


def test_the_effect_probe_tells_changes_and_new_answers_from_repeats(env, seed):
    def task(reference):
        return Task.from_json(_candidate(seed, [f"turn {i}" for i in range(len(reference))], reference)["spec"])

    assert no_effect_turn(env, task([[LS]])) is None  # a listing answers something
    assert no_effect_turn(env, task([[CD], [LS]])) is None  # another folder's listing is new
    assert no_effect_turn(env, task([[MK], [LS]])) is None  # the listing now shows temp
    assert no_effect_turn(env, task([[PWD], [CD], [PWD]])) is None  # a new working directory
    assert no_effect_turn(env, task([[PWD], [PWD]])) == 1  # the same answer again
    assert no_effect_turn(env, task([[CD, LS], [], [LS]])) == 2  # an empty turn is skipped, not judged


def test_a_reference_whose_result_cannot_be_reproduced_fails_the_first_pass(env, seed):
    # the reference of turn 0 lists 'temp', which only exists after turn 1's mkdir: replay
    # runs it without error but it does not reach the goal it claims
    rows = [_candidate(seed, ["a", "b"], [[CD, {"name": "cd", "arguments": {"folder": "temp"}}], [MK]], "order")]
    reason, _ = replay(env, Task.from_json(rows[0]["spec"]))
    assert reason and reason.startswith("pass 1 replay")
    # validation's quality gate refuses it earlier: 'temp' is no folder the state or an earlier call shows
    out = validate_rows(rows, [], env, load_config(), None)
    assert out[0]["verdict"] == "rejected" and out[0]["reason"].startswith("wrong role: cd.folder='temp'")


def test_learnable_verdicts():
    assert learnable(Attempts([0.0, 0.5], [False, False]), True)["reason"] == (
        "accepted: pass 2 failed 2 attempts with progress 0.50"
    )
    assert learnable(Attempts([0.0, 0.0], [False, False]), True)["reason"].startswith("pass 2 no progress")
    assert learnable(Attempts([1.0, 1.0], [True, True]), True)["reason"] == "pass 2 too easy: solved in all 2 attempts"
    assert learnable(Attempts([1.0, 1.0], [True, True]), False)["verdict"] == "accepted"
    assert (
        learnable(Attempts([1.0, 0.0], [True, False]), True)["reason"] == "accepted: pass 2 solved in 1 of 2 attempts"
    )
    assert learnable(Attempts([], []), True)["verdict"] == "rejected"


class ScriptedPolicy(ReplayPolicy):
    """Replays a task's reference for the first ``turns[task_id][sample]`` turns of each
    attempt, then ends every later turn without a call: attempts under the test's control."""

    def __init__(self, tasks, turns):
        super().__init__(tasks)
        self.turns = turns

    def chat(self, conversations, tools, sampling, meta=None):
        out = super().chat(conversations, tools, sampling, meta)
        for i, m in enumerate(meta):
            if m["turn"] >= self.turns[m["task_id"]][m["sample_idx"]]:
                out[i].text = FINAL_TEXT
        return out


def test_pass_two_through_the_rollout_engine(env, seed):
    """Two attempts per candidate, run by the rollout engine with a scripted policy."""
    two_turns = [[CD], [MK]]
    rows = [
        _candidate(seed, ["Go to document.", "Make temp."], two_turns, "easy"),  # both attempts solve it
        _candidate(seed, ["Make temp."], [[MK]], "once"),  # solved in one attempt of two
        _candidate(seed, ["List.", "Go to document."], [[LS], [CD]], "partial"),  # turn 0 only: fails, progress 0.5
        _candidate(seed, ["Where am I?", "Make temp."], [[PWD], [MK]], "hopeless"),  # no call at all
    ]
    tasks = [Task.from_json(r["spec"]) for r in rows]
    script = {tasks[0].task_id: [2, 2], tasks[1].task_id: [1, 0], tasks[2].task_id: [1, 1], tasks[3].task_id: [0, 0]}
    cfg = load_config(overrides={"validate.attempts": 2, "env.step_limit": 2})
    solver = _episode_solver(ScriptedPolicy(tasks, script), cfg, None, "t", 1)
    out = {r["candidate_id"]: r for r in validate_rows(rows, [], env, cfg, solver)}
    assert out["easy"]["reason"] == "pass 2 too easy: solved in all 2 attempts" and out["easy"]["verdict"] == "rejected"
    assert out["once"]["reason"] == "accepted: pass 2 solved in 1 of 2 attempts" and out["once"]["success"]
    assert out["partial"]["verdict"] == "accepted" and out["partial"]["reason"].startswith(
        "accepted: pass 2 failed 2 attempts"
    )
    assert out["partial"]["success"] is False and out["partial"]["reward"] >= 0.5
    assert out["hopeless"]["reason"].startswith("pass 2 no progress") and out["hopeless"]["reward"] == 0.0


def test_pass_two_is_skipped_without_a_policy(env, seed, tmp_path):
    """Round 0: validate(..., policy_path=None) runs the mechanical checks and pass 1 only."""
    from coevolve.store import Store

    store = Store(str(tmp_path / "store"))
    rows = [_candidate(seed, ["Make temp."], [[MK]], "a"), _candidate(seed, ["Where?", "Again?"], [[PWD], [PWD]], "b")]
    store.write("candidates", 0, "t-candidates", rows)
    cfg = load_config(overrides={"store": store.uri, "run_name": "t"})
    assert cfg.validate.solver == "policy" and cfg.validate.attempts == 2
    table = validate(store, cfg, "t", 0, None)
    verdicts = {r["candidate_id"]: (r["verdict"], r["reason"].split(":")[0]) for r in table.to_pylist()}
    assert verdicts == {"a": ("accepted", "accepted"), "b": ("rejected", "pass 1 no effect")}
    assert "pass 2 skipped" in table.to_pylist()[0]["reason"]
    assert store.read("rollouts").num_rows == 0  # no attempt was made


def test_pass_two_elsewhere_gets_what_pass_one_let_through_in_order(env, seed, tmp_path):
    """validate(..., pass2=...), the flows' fan-out: pass 1 runs here, in order; the specs it let
    through go to ``pass2`` in candidate order; its verdicts land on them ({} keeps pass 1's)."""
    from coevolve.store import Store
    from coevolve.validate import pass2_specs

    store = Store(str(tmp_path / "store"))
    rows = [
        _candidate(seed, ["Make temp."], [[MK]], "a"),
        _candidate(seed, ["Where?", "Again?"], [[PWD], [PWD]], "b"),  # pass 1: no effect
        _candidate(seed, ["Go to document.", "Make temp."], [[CD], [MK]], "c"),
    ]
    store.write("candidates", 1, "t-candidates", rows)
    cfg = load_config(overrides={"store": store.uri, "run_name": "t"})
    seen = []

    def pass2(specs):
        seen.append(specs)
        return [{"verdict": "rejected", "reason": "pass 2 too easy: solved in all 2 attempts"}, {}], []

    table = validate(store, cfg, "t", 1, "some-checkpoint", pass2=pass2)
    assert seen == [[rows[0]["spec"], rows[2]["spec"]]]
    got = {r["candidate_id"]: (r["verdict"], r["reason"].split(":")[0]) for r in table.to_pylist()}
    assert got == {
        "a": ("rejected", "pass 2 too easy"),
        "b": ("rejected", "pass 1 no effect"),
        "c": ("accepted", "accepted"),
    }
    # a chunk in a worker: no solver to attempt with keeps pass 1's verdicts, and writes nothing
    none = load_config(overrides={"validate.solver": "none"})
    assert pass2_specs(none, "t", 1, "some-checkpoint", [rows[0]["spec"]]) == ([{}], [])


def test_safety_rules_and_config_errors_are_clear(seed):
    policy = SafetyPolicy(["rm"], [r"send_message.message~(?i)password", r"*.amount~^\d{7,}"])
    task = dataclasses.replace(seed, reference_actions=[[{"name": "fund_account", "arguments": {"amount": 12345678}}]])
    assert policy.check(task) == "unsafe: fund_account.amount matches '^\\\\d{7,}'"
    assert policy.check(dataclasses.replace(seed, reference_actions=[[CD]])) is None
    with pytest.raises(ConfigError, match="validate.attempts"):
        load_config(overrides={"validate.attempts": 0})
    with pytest.raises(ConfigError, match="function.argument~regex"):
        load_config(overrides={"validate.blocked_arguments": ["no-tilde"]})
    with pytest.raises(ConfigError, match="validate.solver"):
        load_config(overrides={"validate.solver": "oracle"})


def _replay_from_pool(env, row) -> bool:
    """Independent of coevolve.validate: a fresh episode from the pool row, its reference
    calls step by step, BFCL's verdict at the end."""
    task = Task.from_row(row)
    ep = BfclEnvironment().episode(task)
    for turn, calls in enumerate(task.reference_actions):
        ep.user_message(turn)
        for call in calls:
            ep.step(ToolCall(call["name"], call["arguments"]))
        ep.end_turn()
    return ep.score().success


def test_embedded_default_round_from_20_signals(signal_store, env):
    """Done-when: rule explorer + template abstractor + BFCL, 20 signals of all three types,
    accepted tasks of every type; each accepted task, committed to the pool and replayed in
    a fresh environment from the pool alone, reaches its goal."""
    seeds = env.load_tasks(["multi_turn_base", "multi_turn_miss_func", "multi_turn_long_context"])
    seeds = [t for i, t in enumerate(seeds) if i % 30 == 0][:20]
    store = signal_store(seeds)
    cfg = load_config(overrides={"store": store.uri, "run_name": "t", "explore.contexts": 24})
    signals = store.read("signals").to_pylist()
    assert len(signals) == 20 and set(Counter(s["signal_type"] for s in signals)) == {"forgetting", "boundary", "rare"}

    n_steps = explore(store, cfg, "t", 1)
    assert n_steps == 20 * cfg.explore.runs_per_context * cfg.explore.steps_per_run
    assert abstract(store, cfg, "t", 1) == 20 * cfg.explore.runs_per_context
    table = validate(store, cfg, "t", 1, None)
    rows = table.to_pylist()
    assert len(rows) == 40 and all(r["verdict"] in ("accepted", "rejected") and r["reason"] for r in rows)
    # the part was rewritten in place, not appended to
    assert store.read("candidates", filter=ds.field("round") == 1).num_rows == 40
    summary = summarize_candidates(table)
    assert set(summary["accepted_by_signal_type"]) == {"forgetting", "boundary", "rare"}
    assert summary["accepted"] >= 20

    # commit the accepted specs as the lead's commit stage does, then replay from the pool alone
    accepted = [Task.from_json(r["spec"]).to_row() for r in rows if r["verdict"] == "accepted"]
    store.commit_pool(run_id="t", round_no=1, new_tasks=accepted, expected_parent=store.latest_pool().version)
    pool = [r for r in store.pool_tasks().to_pylist() if r["origin"] == "explored"]
    assert len(pool) == summary["accepted"]
    assert all(_replay_from_pool(env, r) for r in pool)
    assert {r["category"] for r in pool} <= {s.category for s in seeds}
    # rare tasks practise their pattern
    rare = {s["signal_id"]: s["pattern"].split(" > ") for s in signals if s["signal_type"] == "rare"}
    practised = 0
    for r in rows:
        if r["verdict"] == "accepted" and r["signal_id"] in rare:
            names = [c["name"] for turn in json.loads(json.loads(r["spec"])["reference_actions"]) for c in turn]
            practised += any(names[i : i + 2] == rare[r["signal_id"]] for i in range(len(names) - 1))
    assert practised >= 1


# ----------------------------------------------------------------------------- llm explorer + abstractor over HTTP
class _ScriptedEndpoint:
    """An OpenAI-compatible ``/v1/chat/completions`` on loopback playing a capable LLM that
    also misbehaves: the explorer gets calls that reuse observed names, chatter without a
    call, broken JSON and a destructive call; the abstractor gets a valid spec for logs of an even number of calls, else junk."""

    def __init__(self):
        import http.server
        import re
        import threading

        endpoint = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                text = endpoint.reply(body["messages"], re)
                out = json.dumps(
                    {
                        "choices": [{"message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
                        "usage": {"prompt_tokens": 1, "completion_tokens": 1},
                    }
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def reply(self, messages, re):
        system, last = messages[0]["content"], messages[-1]["content"]
        if system.startswith("You write training tasks"):
            calls = [
                {"name": m.group(1), "arguments": json.loads(m.group(2))}
                for m in re.finditer(r"^\d+\. (\w+)\((\{.*?\})\) ->", last, re.M)
            ]
            if len(calls) % 2:
                return '{"turns": [{"instruction": "Do it", "calls": ['
            half = len(calls) // 2
            return (
                "```json\n"
                + json.dumps(
                    {
                        "turns": [
                            {
                                "instruction": f"Please run {', '.join(c['name'] for c in calls[:half])} with {json.dumps(calls[:half])}.",
                                "calls": calls[:half],
                            },
                            {
                                "instruction": f"Now {', '.join(c['name'] for c in calls[half:])} with {json.dumps(calls[half:])}.",
                                "calls": calls[half:],
                            },
                        ]
                    }
                )
                + "\n```"
            )
        listed = re.findall(r'"current_directory_content": \[([^\]]*)\]', "\n".join(m["content"] for m in messages))
        names = re.findall(r'"([^"]+)"', listed[-1]) if listed else []
        script = [
            '<tool_call>{"name": "ls", "arguments": {}}</tool_call>',
            "Let me think about what to do next.",
            '<tool_call>{"name": "cd", "arguments": {"folder": %s}}</tool_call>'
            % json.dumps(names[0] if names else "x"),
            '<tool_call>{"name": "ls", "arguments": {"a": true}}</tool_call>',
            "<tool_call>{'name': broken</tool_call>",
            '<tool_call>{"name": "rm", "arguments": {"file_name": "log.txt"}}</tool_call>',
            '<tool_call>{"name": "pwd", "arguments": {}}</tool_call>',
        ]
        # the next line after the last reply still in the prompt (old steps get trimmed to fit)
        said = [m["content"] for m in messages if m["role"] == "assistant"]
        return script[(script.index(said[-1]) + 1) % len(script) if said else 0]


@pytest.fixture(scope="module")
def scripted_endpoint():
    ep = _ScriptedEndpoint()
    yield ep.url
    ep.server.shutdown()


def test_llm_explorer_and_abstractor_round_over_http(signal_store, env, scripted_endpoint):
    seeds = env.load_tasks(["multi_turn_base"], limit=6)
    store = signal_store(seeds)
    cfg = load_config(
        overrides={
            "store": store.uri,
            "run_name": "t",
            "explore.explorer": "llm",
            "explore.base_url": scripted_endpoint,
            "explore.model": "scripted",
            "explore.steps_per_run": 7,
            "abstract.abstractor": "llm",
            "abstract.base_url": scripted_endpoint,
            "abstract.model": "scripted",
            "validate.solver": "explorer",
            "env.step_limit": 6,  # the scripted solver needs a few messages per turn
        }
    )
    assert explore(store, cfg, "t", 1) == 6 * 2 * 7
    steps = store.read("explorations").to_pylist()
    failed = Counter(r["error"].split(":")[0] for r in steps if r["action_name"] is None)
    assert failed["no tool call in the reply"] == 12 and failed["no valid tool call"] == 12
    assert failed["blocked call"] == 12  # the LLM's rm never ran
    # the third step reuses a name the first step's listing showed
    first = {(r["signal_id"], r["run_idx"]): r["observation"] for r in steps if r["step"] == 0}
    cds = [r for r in steps if r["action_name"] == "cd"]
    assert len(cds) == 12 and sum(r["error"] is None for r in cds) >= 6
    assert all(json.loads(r["action_args"])["folder"] in first[(r["signal_id"], r["run_idx"])] + "x" for r in cds)
    assert abstract(store, cfg, "t", 1) == 12
    table = validate(store, cfg, "t", 1, None)
    rows = table.to_pylist()
    assert all(r["verdict"] in ("accepted", "rejected") and r["reason"] for r in rows)
    summary = summarize_candidates(table)
    assert summary["accepted"] >= 1 and set(summary["accepted_by_signal_type"]) <= {"forgetting", "boundary", "rare"}
    kinds = Counter(r["reason"].split(":")[0] for r in rows if r["verdict"] == "rejected")
    assert (
        set(kinds)
        <= {
            "llm abstractor",
            "duplicate",
            "near-duplicate",
            "pass 1 replay",
            "pass 1 no effect",
            "pass 2 no progress",
            "pass 2 too easy",
        }
        and kinds["llm abstractor"] >= 2
    )
    # the explorer LLM as the pass-2 solver (it needs no trained policy)
    assert any(r["reason"].startswith("accepted: pass 2 failed") for r in rows)


@pytest.fixture(scope="module")
def tiny_server():
    """``coevolve serve --model tiny`` as its own process on a free loopback port."""
    from serve_helpers import served_tiny_model

    with served_tiny_model() as url:
        yield url


def test_llm_round_against_a_tiny_local_model_never_crashes(signal_store, env, tiny_server):
    """A real model that cannot do the job: its useless explorations and malformed specs are
    rejected with reasons, and the round completes."""
    seeds = env.load_tasks(["multi_turn_base"], limit=3)
    store = signal_store(seeds)
    llm = {
        "store": store.uri,
        "run_name": "t",
        "explore.explorer": "llm",
        "explore.base_url": tiny_server,
        "explore.model": "tiny",
        "explore.steps_per_run": 3,
        "explore.max_new_tokens": 48,
        "abstract.abstractor": "llm",
        "abstract.base_url": tiny_server,
        "abstract.model": "tiny",
        "abstract.max_new_tokens": 64,
        "validate.solver": "explorer",
        "policy.max_new_tokens": 32,
        "explore.min_contexts": 0,
    }  # the 3 signals only: no cold-start fallback contexts
    cfg = load_config(overrides=llm)
    assert explore(store, cfg, "t", 1) == 3 * 2 * 3
    steps = store.read("explorations").to_pylist()
    assert all(r["action_name"] or r["error"] for r in steps)
    abstract(store, cfg, "t", 1)
    table = validate(store, cfg, "t", 1, None)
    assert table.num_rows == 6 and all(r["verdict"] and r["reason"] for r in table.to_pylist())

    # the llm abstractor on runs that did something (rule explorer): the tiny model's text is
    # not a spec, and every such candidate says why
    cfg = load_config(overrides={**llm, "explore.explorer": "rule"})
    explore(store, cfg, "t", 1)
    abstract(store, cfg, "t", 1)
    rows = validate(store, cfg, "t", 1, None).to_pylist()
    assert len(rows) == 6 and all(r["verdict"] and r["reason"] for r in rows)
    assert sum(r["reason"].startswith("llm abstractor: malformed output") for r in rows) >= 3


def test_the_explorer_solver_needs_an_endpoint():
    from coevolve.registry import resolve

    with pytest.raises(ConfigError, match="explore.base_url"):
        resolve("solver", "explorer")(load_config(overrides={"validate.solver": "explorer"}), None, "t", 1, None)


def test_a_failing_solver_rejects_with_its_reason_instead_of_crashing(env, seed):
    def down(tasks):
        raise ConnectionError("endpoint unreachable")

    out = validate_rows([_candidate(seed, ["a"], [[CD]], "c")], [], env, load_config(), down)
    assert out[0]["verdict"] == "rejected" and out[0]["reason"].startswith(
        "pass 2 solver: policy failed: ConnectionError"
    )
