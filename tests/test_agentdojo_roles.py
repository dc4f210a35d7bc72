"""AgentDojo's value roles (coevolve.envs.agentdojo_roles) and what the gate makes of them: over
every tool of the four suites the picker only returns values of the parameter's own role
(recipients from the user's own records, dates of the right kind, ids that exist); planted
wrong-role values are refused by the quality gate with their rule; results read back as
data; the failures a tool *returns* are errors; goal texts say every value in the sentence."""

from __future__ import annotations

import dataclasses
import datetime
import json
import random
import re

import pytest

pytest.importorskip("agentdojo")

from coevolve.envs import agentdojo as ad  # noqa: E402
from coevolve.envs.agentdojo import AgentDojoEnvironment  # noqa: E402
from coevolve.envs.agentdojo_goals import GOALS  # noqa: E402
from coevolve.envs.agentdojo_roles import RESULT_ROLES, TABLE  # noqa: E402
from coevolve.envs.base import Observation, ToolCall  # noqa: E402
from coevolve.explore import start_task  # noqa: E402
from coevolve.quality import rule_of, task_problems  # noqa: E402
from coevolve.roles import is_filler, param_roles  # noqa: E402
from coevolve.values import ValuePool, role_problem  # noqa: E402

# required parameters no value of whose role is in the suite's default state (nothing made up)
UNFILLABLE = {("slack", "invite_user_to_slack", "user_email")}
SEEDS = range(25)


@pytest.fixture(scope="module")
def env():
    return AgentDojoEnvironment()


@pytest.fixture(scope="module")
def states(env):
    return {t.initial_state["suite"]: t for t in env.training_states(0, 0)}


def _pool(env, state):
    pool = ValuePool(env.value_roles())
    pool.harvest(env.state_data(state.initial_state), "state")
    return pool


def _task(state, reference, turns=None):
    return dataclasses.replace(
        start_task(state),
        task_id=f"{state.task_id}~q",
        turns=turns or [f"Turn {i}." for i in range(len(reference))],
        reference_actions=reference,
    )


def _items(value):
    return value if isinstance(value, list) else [value]


def test_the_environment_serves_the_agentdojo_table(env):
    assert env.value_roles() is TABLE


@pytest.mark.parametrize("suite", ad.SUITES)
def test_the_picker_never_returns_a_value_of_another_role(env, states, suite):
    """Property: for every parameter of every tool, over many seeds, a picked value passes the
    gate's role rule, is no filler, has its role's format, and, for a role a task may not make
    up, is one the state lists under that very role (``"@<role>"`` of ``state_data``)."""
    state = states[suite]
    listed = env.state_data(state.initial_state)["@entities"]
    checked, unfilled = 0, set()
    for doc in env.function_docs(state):
        name = doc["name"]
        for p in param_roles(doc, TABLE):
            pool = _pool(env, state)
            for seed in SEEDS:
                value = pool.pick(p, random.Random(seed), function=name)
                if value is None:
                    unfilled.add((suite, name, p.name))
                    continue
                checked += 1
                assert not is_filler(value), (name, p.name, value)
                assert role_problem(p, value, pool, name) is None, (name, p.name, value)
                for v in _items(value):
                    fmt = TABLE.formats.get(p.role)
                    if fmt and isinstance(v, str):
                        assert re.fullmatch(fmt, v), (name, p.name, p.role, v)
                    made = p.role in TABLE.creatable and (
                        p.role not in TABLE.existing or f"{name}.{p.name}" in TABLE.new
                    )
                    if not made and not p.enum and p.type != "boolean":
                        assert v in listed.get(f"@{p.role}", []), (name, p.name, p.role, v)
            if p.required and (suite, name, p.name) not in UNFILLABLE:
                assert (suite, name, p.name) not in unfilled, f"{name}.{p.name} ({p.role}) has no value"
    assert checked > 100


def test_recipients_come_from_the_users_own_records(env, states):
    banking, workspace, slack = states["banking"], states["workspace"], states["slack"]
    bank = banking.initial_state["environment"]["bank_account"]
    parties = {t["recipient"] for t in bank["transactions"] + bank["scheduled_transactions"]}
    parties |= {t["sender"] for t in bank["transactions"]}
    payees = {
        pool.pick(p, random.Random(s), function="send_money")
        for s in SEEDS
        for pool in [_pool(env, banking)]
        for p in param_roles(next(d for d in env.function_docs(banking) if d["name"] == "send_money"), TABLE)
        if p.name == "recipient"
    }
    assert payees and payees <= parties - {"me", bank["iban"]}
    records = json.dumps(workspace.initial_state["environment"])
    doc = next(d for d in env.function_docs(workspace) if d["name"] == "send_email")
    (rec,) = [p for p in param_roles(doc, TABLE) if p.name == "recipients"]
    pool = _pool(env, workspace)
    picked = [e for s in SEEDS for e in pool.pick(rec, random.Random(s), function="send_email")]
    own = workspace.initial_state["environment"]["inbox"]["account_email"]
    assert own not in picked and all(records.count(f'"{e}"') >= 3 for e in picked)  # people the user deals with
    users = set(slack.initial_state["environment"]["slack"]["users"])
    doc = next(d for d in env.function_docs(slack) if d["name"] == "invite_user_to_slack")
    (new_user,) = [p for p in param_roles(doc, TABLE) if p.name == "user"]
    invited = {_pool(env, slack).pick(new_user, random.Random(s), function="invite_user_to_slack") for s in SEEDS}
    assert invited and not invited & users  # only an invitation names someone new


@pytest.mark.parametrize(
    ("suite", "function", "start", "end"),
    [
        ("workspace", "create_calendar_event", "start_time", "end_time"),
        ("workspace", "reschedule_calendar_event", "new_start_time", "new_end_time"),
        ("travel", "reserve_hotel", "start_day", "end_day"),
        ("travel", "reserve_car_rental", "start_time", "end_time"),
    ],
)
def test_dates_are_of_their_kind_after_the_present_and_ends_follow_starts(env, states, suite, function, start, end):
    state = states[suite]
    today = ad._present(state.initial_state)
    doc = next(d for d in env.function_docs(state) if d["name"] == function)
    params = {p.name: p for p in param_roles(doc, TABLE)}
    for seed in SEEDS:
        rng, pool = random.Random(seed), _pool(env, state)
        a, b = (pool.pick(params[n], rng, function=function) for n in (start, end))  # in the doc's order
        fmt = "%Y-%m-%d %H:%M" if params[start].role == "datetime" else "%Y-%m-%d"
        begin, finish = datetime.datetime.strptime(a, fmt), datetime.datetime.strptime(b, fmt)
        assert a[:10] > today and begin < finish, (a, b)


def test_planted_wrong_role_values_are_refused_with_their_rule(env, states):
    banking, workspace, travel, slack = (states[s] for s in ("banking", "workspace", "travel", "slack"))
    payment = {"recipient": "GB29NWBK60161331926819", "amount": 100.0, "subject": "Rent", "date": "2022-03-20"}
    planted = {
        # a file name as an IBAN, filler as a date
        "file as recipient": (banking, "send_money", {**payment, "recipient": "address-change.txt"}),
        "filler date": (banking, "schedule_transaction", {**payment, "date": "date 55", "recurring": False}),
        # a date as the recipient, a file name as the date
        "date as recipient": (banking, "send_money", {**payment, "recipient": "2022-03-01"}),
        "file as date": (banking, "send_money", {**payment, "date": "landlord-notices.txt"}),
        # an IBAN nobody in the records has
        "stranger iban": (banking, "send_money", {**payment, "recipient": "FR7630006000011234567890189"}),
        "number as email": (workspace, "share_file", {"file_id": "25", "email": "0", "permission": "r"}),
        "no such file": (workspace, "get_file_by_id", {"file_id": "99"}),
        "channel as user": (slack, "send_direct_message", {"recipient": "general", "body": "Hi there."}),
        "hotel city for restaurants": (travel, "get_all_restaurants_in_city", {"city": "Tokyo"}),
    }
    expected = {
        "file as recipient": "wrong role: send_money.recipient='address-change.txt' is no known iban",
        "filler date": "filler: schedule_transaction.date='date 55'",
        "date as recipient": "wrong role: send_money.recipient='2022-03-01' is no known iban",
        "file as date": "wrong role: send_money.date='landlord-notices.txt' is no known day",
        "stranger iban": "wrong role: send_money.recipient='FR7630006000011234567890189' is no known iban",
        "number as email": "wrong role: share_file.email='0' is no known email",
        "no such file": "wrong role: get_file_by_id.file_id='99' is no known file_id",
        "channel as user": "wrong role: send_direct_message.recipient='general' is no known slack_user",
        "hotel city for restaurants": "wrong role: get_all_restaurants_in_city.city='Tokyo' is no known restaurant_city",
    }
    for key, (state, name, args) in planted.items():
        problems = task_problems(env, _task(state, [[{"name": name, "arguments": args}]]))
        assert expected[key] in problems, (key, problems)
        assert rule_of(expected[key]) in {rule_of(p) for p in problems}


def test_real_values_from_the_state_pass_and_empty_answers_fail(env, states):
    banking, workspace, travel = states["banking"], states["workspace"], states["travel"]
    good = [
        (
            banking,
            [
                [{"name": "get_scheduled_transactions", "arguments": {}}],
                [
                    {
                        "name": "send_money",
                        "arguments": {
                            "recipient": "SE3550000000054910000003",
                            "amount": 50.0,
                            "subject": "Spotify Premium",
                            "date": "2022-03-20",
                        },
                    },
                    {"name": "update_scheduled_transaction", "arguments": {"id": 7, "amount": 1200.0}},
                ],
            ],
        ),
        (
            workspace,
            [
                [
                    {"name": "search_contacts_by_name", "arguments": {"query": "Lily White"}},
                    {
                        "name": "share_file",
                        "arguments": {"file_id": "8", "email": "lily.white@gmail.com", "permission": "rw"},
                    },
                    {"name": "get_day_calendar_events", "arguments": {"day": "2024-05-15"}},
                ]
            ],
        ),
        (
            travel,
            [
                [
                    {"name": "get_all_restaurants_in_city", "arguments": {"city": "London"}},
                    {
                        "name": "reserve_hotel",
                        "arguments": {"hotel": "Good Night", "start_day": "2024-06-01", "end_day": "2024-06-04"},
                    },
                ]
            ],
        ),
    ]
    for state, reference in good:
        assert task_problems(env, _task(state, reference)) == [], reference
    empty = _task(workspace, [[{"name": "get_day_calendar_events", "arguments": {"day": "2030-01-02"}}]])
    assert task_problems(env, empty) == ["failing goal: turn 0 get_day_calendar_events returns nothing found"]


def test_results_read_back_as_data_of_their_roles(env, states):
    workspace, banking, slack = states["workspace"], states["banking"], states["slack"]
    ep = env.episode(start_task(workspace))
    made = ep.step(ToolCall("create_file", {"filename": "trip-notes.txt", "content": "Pack the tent."}))
    data = env.result_data(made.content, "create_file")
    assert data["filename"] == "trip-notes.txt" and data["last_modified"] == "@clock"  # a masked clock stamp
    pool = _pool(env, workspace)
    (file_id,) = [
        p for p in param_roles(next(d for d in env.function_docs(workspace) if d["name"] == "get_file_by_id"), TABLE)
    ]
    new_id = data["id_"]
    assert role_problem(file_id, new_id, pool, "get_file_by_id") is not None  # not in the start state
    pool.harvest(data, "result", function="create_file")
    assert role_problem(file_id, new_id, pool, "get_file_by_id") is None  # the result proved it
    assert (("file_id", new_id)) in pool.fresh

    ep = env.episode(start_task(banking))
    data = env.result_data(
        ep.step(ToolCall("get_most_recent_transactions", {"n": 5})).content, "get_most_recent_transactions"
    )
    assert isinstance(data, list) and all(t.get("recipient") != "me" and t.get("sender") != "me" for t in data)
    pool = ValuePool(TABLE)
    pool.harvest(data, "result", function="get_most_recent_transactions")
    assert "me" not in pool.by_role["iban"] and set(pool.by_role["iban"]) >= {"CH9300762011623852957"}
    assert env.result_data(ep.step(ToolCall("get_balance", {})).content, "get_balance") == {"@balance": 1810.0}
    sent = ep.step(
        ToolCall(
            "send_money", {"recipient": "CH9300762011623852957", "amount": 5.0, "subject": "x", "date": "2022-03-20"}
        )
    )
    assert env.result_data(sent.content) == {"message": "Transaction to CH9300762011623852957 for 5.0 sent."}

    ep = env.episode(start_task(slack))
    channels = env.result_data(ep.step(ToolCall("get_channels", {})).content, "get_channels")
    assert channels == {"@slack_channel": ["general", "random", "private", "External_0"]}
    assert env.result_data(ep.step(ToolCall("get_channels", {})).content) == [
        "general",
        "random",
        "private",
        "External_0",
    ]
    assert env.result_data("Hotel Names: Le Marais Boutique\nGood Night\n") == {
        "@hotel": ["Le Marais Boutique", "Good Night"]
    }
    assert env.result_data("Hotel Names: City Hub\n") == {"@hotel": ["City Hub"]}
    assert env.result_data("None") is None and env.result_data("Error: ValueError: x") is None
    for role in {*RESULT_ROLES.values(), "hotel", "restaurant", "car_company", "restaurant_city", "car_rental_city"}:
        assert TABLE.keys.get(f"@{role}") == role  # every "@<role>" a view writes is read back as that role


def test_failures_a_tool_returns_are_errors(env, states):
    failing = {
        ("banking", "read_file", (("file_path", "nope.txt"),)),
        ("travel", "get_all_hotels_in_city", (("city", "Berlin"),)),
        ("travel", "get_hotels_prices", (("hotel_names", ("Nope",)),)),
        ("travel", "get_flight_information", (("departure_city", "London"), ("arrival_city", "Tokyo"))),
        ("workspace", "search_files_by_filename", (("filename", "nope.txt"),)),
        ("workspace", "get_day_calendar_events", (("day", "2030-01-01"),)),
        ("slack", "get_webpage", (("url", "www.nope.com"),)),
        ("workspace", "delete_email", (("email_id", "999"),)),  # raised: still an error
    }
    passing = {
        ("banking", "get_balance", ()),
        ("banking", "read_file", (("file_path", "landlord-notices.txt"),)),
        ("travel", "get_all_hotels_in_city", (("city", "Paris"),)),
        ("slack", "send_direct_message", (("recipient", "Bob"), ("body", "Hi"))),  # returns None
        ("workspace", "search_calendar_events", (("query", "yoga"),)),
    }
    for cases, wanted in ((failing, True), (passing, False)):
        for suite, name, args in cases:
            kwargs = {k: list(v) if isinstance(v, tuple) else v for k, v in args}
            obs = env.episode(start_task(states[suite])).step(ToolCall(name, kwargs))
            assert bool(env.observation_error(obs)) is wanted, (name, kwargs, obs.content[:80])
    assert env.observation_error(Observation(content="Car Rental Companies in Rome: \n")) == (
        "Car Rental Companies in Rome: nothing found"
    )


def test_goal_texts_say_every_value_in_the_sentence(env, states):
    for suite, state in states.items():
        for doc in env.function_docs(state):
            goal, props = doc["goal"], doc["parameters"]["properties"]
            texts = goal["texts"]
            said = {p for t in texts for p in re.findall(r"\{(\w+)\}", t)}
            assert goal["kind"] in {"do", "answer", "read"}
            assert said <= set(props), (doc["name"], said - set(props))
            assert set(doc["parameters"]["required"]) <= said, doc["name"]
            assert len(texts) >= 2, f"{doc['name']}: give a second phrasing"
            assert not any("(" in t or ")" in t for t in texts), doc["name"]
            for p, words in goal.get("values", {}).items():
                assert set(words) >= set(props[p].get("enum") or words), (doc["name"], p)
    assert set(GOALS) == {d["name"] for s in ad.SUITES for d in ad.tool_docs(s)}
