"""The environment contract (coevolve.envs.base), checked for every registered environment.

An implementer of a new environment registers it and runs
``pytest tests/test_env_contract.py -k <name>``: each test states one clause of the contract.
"""

from __future__ import annotations

import json

import pytest

from coevolve import registry
from coevolve.envs.base import EpisodeScore, Observation, ToolCall
from coevolve.explore import run_sessions, start_task
from coevolve.explorers.base import ExploreContext
from coevolve.explorers.rule import RuleExplorer
from coevolve.safety import SafetyProfile
from coevolve.tasks import Task

NAMES = registry.names("environment")


@pytest.fixture(scope="module", params=NAMES)
def env(request):
    return registry.resolve("environment", request.param)()


@pytest.fixture(scope="module")
def state(env) -> Task:
    """One training state of the environment (the first, with nothing held out)."""
    states = env.training_states(0, 0)
    assert states, "training_states must offer at least one state"
    return states[0]


def _call_for(env, task: Task) -> ToolCall:
    """A call without arguments that succeeds from the task's start state (else the first function)."""
    docs = env.function_docs(task)
    probe = env.episode(env.start_state(task))
    for doc in docs:
        if not (doc.get("parameters") or {}).get("required"):
            call = ToolCall(doc["name"], {})
            if not env.observation_error(probe.step(call)):
                return call
    return ToolCall(docs[0]["name"], {})


def test_registered_with_its_name_and_categories(env):
    assert env.name in NAMES and env.categories and all(isinstance(c, str) for c in env.categories)


def test_training_states_are_state_only(env, state):
    for task in env.training_states(0, 0):
        assert task.turns == [] and task.reference_actions == [], "a training state has no question, no ground truth"
        assert task.env == env.name and task.split == "train" and task.tools
        assert isinstance(env.scenario_of(task), str) and env.scenario_of(task)
        json.dumps(task.initial_state)  # a state is JSON (it is stored in the tasks table)


def test_heldout_tasks_are_disjoint_from_training_scenarios(env):
    held = env.heldout_tasks(5, 0, scenarios=2)
    assert held and all(t.turns and len(t.turns) == len(t.reference_actions) for t in held)
    assert held == env.heldout_tasks(5, 0, scenarios=2), "held-out tasks are a function of (heldout, seed)"
    states = env.training_states(5, 0)
    assert not {t.task_id for t in held} & {t.task_id for t in states}
    prompts = {turn for t in held for turn in t.turns if turn}
    for task in states:  # no question of a held-out task reaches a training state
        text = json.dumps(task.initial_state)
        assert not any(p in text for p in prompts)


def test_start_state_opens_one_turn_with_every_tool(env, state):
    start = env.start_state(state)
    assert start.turns == [""] and start.reference_actions == [[]]
    assert start_task(state, env).initial_state == start.initial_state
    names = {d["name"] for d in env.function_docs(start)}
    ep = env.episode(start)
    assert ep.n_turns == 1 and ep.user_message(0) is None
    schemas = ep.tools(0)
    assert {s["name"] for s in schemas} == names
    for s in schemas:
        assert isinstance(s.get("description"), str) and s["parameters"]["type"] == "object"


def test_bad_calls_are_error_observations_never_exceptions(env, state):
    ep = env.episode(env.start_state(state))
    bad = [ToolCall("no_such_function_xyz", {}), ToolCall("__class__", {}), ToolCall(_call_for(env, state).name, ["x"])]
    for call in bad:
        obs = ep.step(call)
        assert isinstance(obs, Observation) and obs.error and env.observation_error(obs)
    good = ep.step(_call_for(env, state))
    assert isinstance(good.content, str)


def test_episodes_are_isolated(env, state):
    """Calls that change one episode's state change neither the task nor another episode."""
    start = env.start_state(state)
    before = json.dumps(start.initial_state, sort_keys=True)
    untouched = env.episode(start)
    if not hasattr(untouched, "state_fingerprint"):
        pytest.skip("the episode has no state_fingerprint: another episode's state cannot be compared")
    fresh = untouched.state_fingerprint()
    # the rule explorer prefers calls that change the state, with arguments taken from the state
    context = ExploreContext("isolation", "static", start, [])
    sessions = run_sessions(RuleExplorer(), [context], env, runs=3, steps=12, seed=0)
    changed = [s for s in sessions if s.episode.state_fingerprint() != fresh]
    assert changed, "no exploration run changed the state: isolation would go unchecked"
    assert untouched.state_fingerprint() == fresh, "stepping one episode changed another"
    assert env.episode(start).state_fingerprint() == fresh, "stepping an episode changed later episodes"
    assert json.dumps(start.initial_state, sort_keys=True) == before, "an episode must not change the task"


def test_a_reference_replay_succeeds_and_doing_nothing_fails(env, state):
    start = env.start_state(state)
    call = _call_for(env, start)
    probe = env.episode(start)
    if env.observation_error(probe.step(call)):
        pytest.skip("the first parameterless function fails from this state")
    task = Task(
        **{**start.__dict__, "turns": ["Do it."], "reference_actions": [[{"name": call.name, "arguments": {}}]]}
    )
    ep = env.episode(task)
    ep.user_message(0)
    ep.step(call)
    ep.end_turn()
    score = ep.score()
    assert isinstance(score, EpisodeScore) and score.success and score.turn_passed == [True] and score.reward > 0
    idle = env.episode(task)
    idle.end_turn()
    assert not idle.score().success and idle.score().reason


def test_state_data_and_safety_profile(env, state):
    data = env.state_data(state.initial_state)
    json.dumps(data)
    profile = env.safety_profile()
    assert isinstance(profile, SafetyProfile)
    names = {d["name"] for t in env.training_states(0, 0) for d in env.function_docs(t)}
    assert set(profile.roles) <= names, "safety roles must name the environment's functions"


def test_domain_text_is_text_of_the_training_side(env):
    texts = env.domain_text()
    assert isinstance(texts, list) and all(isinstance(t, str) for t in texts)
    corpus = "\n".join(texts)
    for task in env.heldout_tasks(3, 0):
        for question in task.turns:
            assert not question or str(question) not in corpus, "domain text must not carry held-out questions"
