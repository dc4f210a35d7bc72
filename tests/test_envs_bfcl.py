"""Tests of the BFCL-V3 environment: loading, schemas, dispatch safety, isolation, budgets,
and verdicts equal to bfcl_eval's own ``multi_turn_checker`` on perturbed ground truth."""

from __future__ import annotations

import copy
import json
import random
import threading

import pytest

from coevolve.envs import bfcl_data
from coevolve.envs.base import ToolCall
from coevolve.envs.bfcl import BfclEnvironment
from coevolve.registry import resolve
from coevolve.tasks import Task


@pytest.fixture(scope="module")
def env() -> BfclEnvironment:
    return BfclEnvironment()


@pytest.fixture(scope="module")
def all_tasks(env) -> list[Task]:
    return env.load_tasks()


def replay(env, task: Task, calls: list[list[dict]] | None = None):
    """Drive one episode with ``calls`` per turn (default: the reference) and score it."""
    ep = env.episode(task)
    for turn, turn_calls in enumerate(calls if calls is not None else task.reference_actions):
        ep.user_message(turn)
        for c in turn_calls:
            ep.step(ToolCall(c["name"], c["arguments"]))
        ep.end_turn()
    return ep, ep.score()


# --------------------------------------------------------------------------- loading
def test_registered_and_loads_all_categories(all_tasks):
    assert resolve("environment", "bfcl-v3") is BfclEnvironment
    by_cat = {c: [t for t in all_tasks if t.category == c] for c in bfcl_data.CATEGORIES}
    assert {c: len(v) for c, v in by_cat.items()} == {c: 200 for c in bfcl_data.CATEGORIES}
    assert [t.category for t in all_tasks] == sorted((t.category for t in all_tasks), key=bfcl_data.CATEGORIES.index)
    ids = [int(t.task_id.rsplit("_", 1)[1]) for t in by_cat["multi_turn_base"]]
    assert ids == list(range(200))
    for t in all_tasks:
        assert len(t.turns) == len(t.reference_actions) and t.env == "bfcl-v3"
        assert all(isinstance(c["arguments"], dict) for turn in t.reference_actions for c in turn)


def test_ground_truth_parsing_maps_positional_args(env):
    task = env.load_tasks(ids=["multi_turn_base_0"])[0]
    assert task.reference_actions[0][0] == {"name": "cd", "arguments": {"folder": "document"}}
    owner = bfcl_data.method_owner(["GorillaFileSystem"])
    assert bfcl_data.parse_call("sort('final_report.pdf')", owner) == {
        "name": "sort",
        "arguments": {"file_name": "final_report.pdf"},
    }
    for bad in ["__import__('os').system('x')", "cd(folder=open('x'))", "cd(**{'a': 1})", "x.y()"]:
        with pytest.raises(ValueError):
            bfcl_data.parse_call(bad, owner)


def test_select_by_ids_and_limit(env):
    got = env.load_tasks(ids=["multi_turn_miss_param_3", "multi_turn_base_7"])
    assert [t.task_id for t in got] == ["multi_turn_base_7", "multi_turn_miss_param_3"]
    assert len(env.load_tasks(["multi_turn_long_context"], limit=3)) == 3
    with pytest.raises(KeyError):
        env.load_tasks(ids=["multi_turn_base_9999"])


def test_tools_respect_held_out_functions(env):
    task = next(t for t in env.load_tasks(["multi_turn_miss_func"]) if t.initial_state["missed_function"])
    ep = env.episode(task)
    ((k, missed),) = task.initial_state["missed_function"].items()
    k = int(k)
    before = {s["name"] for s in ep.tools(k - 1)}
    after = {s["name"] for s in ep.tools(k)}
    assert not set(missed) & before and set(missed) <= after
    assert task.turns[k] == "" and "more functions" in ep.user_message(k)
    schema = ep.tools(k)[0]
    assert set(schema) == {"name", "description", "parameters"} and schema["parameters"]["type"] == "object"
    docs = env.function_docs(task)
    assert {d["name"] for d in docs} == set(task.tools) and all("parameters" in d for d in docs)


# --------------------------------------------------------------------------- faithfulness
def test_reference_replay_scores_every_entry(env, all_tasks):
    for task in all_tasks:
        ep, score = replay(env, task)
        assert score.success and score.reward == 1.0, (task.task_id, score)


def test_partial_reward_counts_turns(env):
    task = env.load_tasks(ids=["multi_turn_base_0"])[0]
    calls = copy.deepcopy(task.reference_actions)
    calls[-1] = []  # skip the last turn
    _, score = replay(env, task, calls)
    assert not score.success and score.turn_passed == [True, True, True, False]
    # the skipped turn reproduced none of its reference: progress 3/4, plus the format bonus
    assert score.progress == 0.75 and score.format == 1.0 and "empty_turn_model_response" in score.reason
    assert score.reward == pytest.approx(0.75 + 0.1)


def test_turn_without_reference_calls(env):
    # BFCL never fails an entry for calling in a turn whose ground truth is empty; the partial
    # reward does (that turn expects the agent to ask instead of act).
    task = next(t for t in env.load_tasks(["multi_turn_miss_param"]) if not t.reference_actions[1])
    calls = copy.deepcopy(task.reference_actions)
    calls[1] = [{"name": "no_such_function", "arguments": {}}]
    _, score = replay(env, task, calls)
    assert score.success and score.turn_passed[1] is False and score.reward < 1.0


def _render(call: dict) -> str:
    return f"{call['name']}(" + ", ".join(f"{k}={v!r}" for k, v in call["arguments"].items()) + ")"


def _mutate_value(v, rng):
    if isinstance(v, bool):
        return not v
    if isinstance(v, (int, float)):
        return v + rng.choice([1, 2.5, -3])
    if isinstance(v, str):
        return v + rng.choice(["x", " ", "_2"]) if v else "x"
    if isinstance(v, list):
        return v[:-1] if v else ["x"]
    if isinstance(v, dict):
        return {**v, "extra": 1}
    return "x"


def _perturb(kind: str, task: Task, rng: random.Random, foreign: list[str]) -> list[list[dict]] | None:
    calls = copy.deepcopy(task.reference_actions)
    spots = [(t, i) for t, turn in enumerate(calls) for i in range(len(turn))]
    if not spots:
        return None
    t, i = rng.choice(spots)
    if kind == "drop":
        del calls[t][i]
    elif kind == "wrong_arg":
        with_args = [(t, i) for t, i in spots if calls[t][i]["arguments"]]
        if not with_args:
            return None
        t, i = rng.choice(with_args)
        key = rng.choice(sorted(calls[t][i]["arguments"]))
        calls[t][i]["arguments"][key] = _mutate_value(calls[t][i]["arguments"][key], rng)
    elif kind == "extra":
        u = rng.randrange(len(calls))
        calls[u].insert(rng.randrange(len(calls[u]) + 1), copy.deepcopy(calls[t][i]))
    elif kind == "reorder":
        multi = [u for u, turn in enumerate(calls) if len(turn) >= 2]
        if not multi:
            return None
        u = rng.choice(multi)
        a, b = rng.sample(range(len(calls[u])), 2)
        calls[u][a], calls[u][b] = calls[u][b], calls[u][a]
    elif kind == "wrong_turn":
        u = t + 1 if t + 1 < len(calls) and (t == 0 or rng.random() < 0.5) else t - 1
        if u < 0:
            return None
        calls[u].insert(rng.randrange(len(calls[u]) + 1), calls[t].pop(i))
    elif kind == "missing":
        calls[t][i]["name"] = rng.choice(foreign)
    return calls


N_PERTURBED = 1020  # perturbed model outputs compared with the official checker


def test_verdicts_equal_official_checker_on_perturbations(env, all_tasks):
    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import multi_turn_checker

    raw = {}
    for cat in bfcl_data.CATEGORIES:
        entries = bfcl_data._read_jsonl(bfcl_data.data_dir() / f"BFCL_v3_{cat}.json")
        answers = bfcl_data._read_jsonl(bfcl_data.data_dir() / "possible_answer" / f"BFCL_v3_{cat}.json")
        for e, a in zip(entries, answers):
            gt = a["ground_truth"]
            if e["id"] in bfcl_data._MERGE_GT_TURNS:
                x, y = bfcl_data._MERGE_GT_TURNS[e["id"]]
                gt = gt[:x] + [gt[x] + gt[y]] + gt[y + 1 :]
            raw[e["id"]] = (e, gt)
    all_methods = {m for c in bfcl_data.CLASSES for m in bfcl_data.public_methods(c)}
    # Backends keep mutable default arguments in their state (TwitterAPI.post_tweet's
    # mentions=[]), so in one process every official check would see earlier ones: give each
    # check pristine defaults, as a fresh process would.
    functions = [f for c in bfcl_data.CLASSES for f in vars(bfcl_data.backend_class(c)).values() if callable(f)]
    pristine = {f: copy.deepcopy(f.__defaults__) for f in functions if getattr(f, "__defaults__", None)}
    rng = random.Random(0)
    kinds = ["drop", "wrong_arg", "extra", "reorder", "wrong_turn", "missing"]
    outcomes = {k: [0, 0] for k in kinds}  # [passes, fails]
    n = 0
    while n < N_PERTURBED:
        task = rng.choice(all_tasks)
        kind = kinds[n % len(kinds)]
        foreign = sorted(all_methods - set(bfcl_data.method_owner(task.initial_state["involved_classes"])))
        calls = _perturb(kind, task, rng, foreign + ["no_such_function"])
        if calls is None:
            continue
        entry, gt = raw[task.task_id]
        decoded = [[[_render(c) for c in turn]] if turn else [] for turn in calls]
        model_name = f"coevolve_case_{n}"
        for f, defaults in pristine.items():
            f.__defaults__ = copy.deepcopy(defaults)
        try:
            official = multi_turn_checker(decoded, gt, entry, task.category, model_name)["valid"]
        finally:  # the official executor caches instances in its module globals: clean them
            for key in [k for k in vars(multi_turn_utils) if k.startswith(model_name)]:
                delattr(multi_turn_utils, key)
        _, score = replay(env, task, calls)
        assert score.success == official, (kind, task.task_id, calls, score)
        outcomes[kind][0 if official else 1] += 1
        n += 1
    assert all(fails > 0 for _, fails in outcomes.values()), outcomes
    assert sum(p for p, _ in outcomes.values()) > 0, outcomes


# --------------------------------------------------------------------------- safety
FUZZ_ERRORS = [  # must come back as errors
    ToolCall("__class__", {}),
    ToolCall("_load_scenario", {"scenario": {}}),
    ToolCall("__init__", {}),
    ToolCall("GorillaFileSystem.cd", {"folder": "x"}),
    ToolCall("__import__", {"name": "os"}),
    ToolCall("eval", {"source": "1+1"}),
    ToolCall("", {}),
    ToolCall("cd", {}),
    ToolCall("cd", {"self": 1}),
    ToolCall("cd", {"folder": "x" * 200_000}),
    ToolCall("cd", {"folder": 10**400}),
    ToolCall("cd", ["document"]),  # type: ignore[arg-type]
    ToolCall("cd", "folder=document"),  # type: ignore[arg-type]
    ToolCall(None, {}),  # type: ignore[arg-type]
    ToolCall("echo", {"content": {"a": object()}}),
    ToolCall("power", {"base": 10, "exponent": 10**12}),
    ToolCall("square_root", {"number": 2, "precision": 10**9}),
    ToolCall("logarithm", {"value": 10, "base": 2, "precision": 10**8}),
]
FUZZ_ANY = [  # wrong types the backends may accept, reject or trip over: never a crash
    ToolCall("cd", {"folder": 12345}),
    ToolCall("cd", {"folder": None}),
    ToolCall("cd", {"folder": [[[[[]]]]]}),
    ToolCall("mean", {"numbers": "not a list"}),
    ToolCall("logarithm", {"value": 10, "base": 0, "precision": 5}),
    ToolCall("tail", {"file_name": "x", "lines": -(10**17)}),
    ToolCall("mv", {"source": {"a": [1, 2]}, "destination": 3.5}),
    ToolCall("echo", {"content": "\x00" * 1000, "file_name": "../../etc/passwd"}),
]


def test_fuzzed_calls_become_error_observations(env):
    task = env.load_tasks(ids=["multi_turn_base_0"])[0]
    task.initial_state["involved_classes"].append("MathAPI")
    ep = env.episode(task)
    rng = random.Random(1)
    junk = [ToolCall("".join(rng.choice("ab_(){}\"'.:") for _ in range(rng.randrange(1, 30))), {}) for _ in range(50)]
    for call in FUZZ_ERRORS + junk:
        obs = ep.step(call)
        assert obs.error and obs.content.startswith("Error during execution"), call
    for call in FUZZ_ANY:
        assert isinstance(ep.step(call).content, str)
    assert len(ep.calls[0]) == len(FUZZ_ERRORS) + len(junk) + len(FUZZ_ANY)
    assert all(isinstance(c["result"], str) for c in ep.calls[0])
    ep.end_turn()
    assert ep.score().success is False


def test_no_globals_and_nothing_in_site_packages(env):
    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils

    before = set(vars(multi_turn_utils))
    replay(env, env.load_tasks(ids=["multi_turn_long_context_3"])[0])
    assert set(vars(multi_turn_utils)) == before
    site = bfcl_data.data_dir().parents[1]
    assert not (site / "result").exists() and not (site / "score").exists()


# --------------------------------------------------------------------------- isolation
def test_two_episodes_of_one_entry_share_nothing(env):
    task = env.load_tasks(ids=["multi_turn_base_0"])[0]
    a, b = env.episode(task), env.episode(task)
    a.step(ToolCall("cd", {"folder": "document"}))
    a.step(ToolCall("mkdir", {"dir_name": "only_in_a"}))
    b.step(ToolCall("cd", {"folder": "document"}))
    assert "only_in_a" not in b.step(ToolCall("ls", {})).content
    assert "only_in_a" in a.step(ToolCall("ls", {})).content


def test_backend_defaults_and_task_data_are_not_shared(env):
    # TwitterAPI.post_tweet(mentions=[]) keeps its default list in the tweet and mention()
    # extends it: without care, every later episode would see those mentions.
    task = env.load_tasks(ids=["multi_turn_long_context_90"])[0]
    pristine = copy.deepcopy(task.reference_actions)
    a = env.episode(task)
    posted = json.loads(a.step(ToolCall("post_tweet", {"content": "x"})).content)
    a.step(ToolCall("mention", {"tweet_id": posted["id"], "mentioned_usernames": ["@leak"]}))
    b = env.episode(task)
    assert json.loads(b.step(ToolCall("post_tweet", {"content": "y"})).content)["mentions"] == []
    replay(env, task)
    replay(env, task)
    assert task.reference_actions == pristine


def test_parallel_episodes_in_threads(env, all_tasks):
    tasks = [t for t in all_tasks if "MathAPI" in t.initial_state["involved_classes"]][:12] + all_tasks[:12]
    failures: list[str] = []

    def work(task: Task) -> None:
        for _ in range(3):
            _, score = replay(env, task)
            if not score.success:
                failures.append(f"{task.task_id}: {score.reason}")

    threads = [threading.Thread(target=work, args=(t,)) for t in tasks]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not failures


# --------------------------------------------------------------------------- budgets
def test_step_wall_clock_limit_ends_the_episode():
    env = BfclEnvironment(step_timeout_s=1e-9)
    task = env.load_tasks(ids=["multi_turn_base_0"])[0]
    ep = env.episode(task)
    obs = ep.step(ToolCall("cd", {"folder": "document"}))
    assert obs.error and obs.error.startswith("time_limit") and ep.finish_reason == "time_limit"
    assert ep.step(ToolCall("ls", {})).error == "time_limit"
    score = ep.score()
    assert not score.success and "time_limit" in score.reason and score.reward == 0.0


def test_unfinished_episode_fails(env):
    task = env.load_tasks(ids=["multi_turn_base_0"])[0]
    ep = env.episode(task)
    for c in task.reference_actions[0]:
        ep.step(ToolCall(c["name"], c["arguments"]))
    ep.end_turn()
    score = ep.score()
    assert not score.success and score.turn_passed == [True, False, False, False]
    assert "ended at turn 1" in score.reason


def test_synthesized_task_scored_against_its_reference(env):
    seed = env.load_tasks(ids=["multi_turn_base_0"])[0]
    synth = Task(
        task_id="explored_1",
        env="bfcl-v3",
        category=seed.category,
        origin="explored",
        turns=["Go to the document folder and make a folder 'x'.", "List it."],
        initial_state=json.loads(json.dumps(seed.initial_state)),
        reference_actions=[
            [{"name": "cd", "arguments": {"folder": "document"}}, {"name": "mkdir", "arguments": {"dir_name": "x"}}],
            [{"name": "ls", "arguments": {}}],
        ],
        tools=seed.tools,
    )
    assert replay(env, synth)[1].success
    wrong = [[{"name": "mkdir", "arguments": {"dir_name": "x"}}], [{"name": "ls", "arguments": {}}]]
    score = replay(env, synth, wrong)[1]
    assert not score.success and score.turn_passed[0] is False


def test_a_rendered_set_reads_the_same_under_every_hash_seed():
    """BFCL's TravelAPI says "Must be one of {valid_classes}" with a Python set, whose order is the
    process's string-hash order: observations must not depend on PYTHONHASHSEED."""
    import os
    import subprocess
    import sys

    from coevolve.envs.bfcl_dispatch import stable_sets

    script = (
        "from coevolve.envs.bfcl_dispatch import stable_sets\n"
        'message = f\'Invalid travel class. Must be one of {set(["economy", "business", "first"])}\'\n'
        "print(message + '|' + stable_sets(message))\n"
    )
    raw, stable = set(), set()
    for seed in range(6):
        env = {**os.environ, "PYTHONHASHSEED": str(seed)}
        out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
        r, s = out.stdout.strip().split("|")
        raw.add(r)
        stable.add(s)
    assert len(raw) > 1, "the hash seeds tried all ordered the set alike: the test shows nothing"
    assert stable == {"Invalid travel class. Must be one of {'business', 'economy', 'first'}"}
    # dicts and single members are left as they are
    assert stable_sets("{'a': 'b', 'c': 'd'}") == "{'a': 'b', 'c': 'd'}"
    assert stable_sets("one of {'x'}") == "one of {'x'}"
