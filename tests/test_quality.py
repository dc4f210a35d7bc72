"""The quality gate (coevolve.quality) and the role-typed value picker (coevolve.values):
filler, wrong-role values and failing goals are refused with their reason; a good
multi-turn task with a reference to an earlier turn passes; the picker never crosses roles."""

from __future__ import annotations

import dataclasses
import json
import random

import pytest

from coevolve.abstract import Run
from coevolve.abstractors.template import TemplateAbstractor
from coevolve.config import load_config
from coevolve.envs import bfcl_data
from coevolve.envs.base import ToolCall
from coevolve.envs.bfcl import BfclEnvironment
from coevolve.explore import start_task
from coevolve.quality import quality_reason, rule_of, task_problems
from coevolve.roles import is_filler, param_roles
from coevolve.values import ValuePool, role_problem
from coevolve.tasks import Task
from coevolve.validate import validate_rows


@pytest.fixture(scope="module")
def env():
    return BfclEnvironment()


@pytest.fixture(scope="module")
def states(env):
    return env.training_states([], 0, ["multi_turn_base"])


def _with_classes(states, *classes):
    return next(t for t in states if set(classes) <= set(t.initial_state["involved_classes"]))


def _task(state, turns, reference):
    return dataclasses.replace(
        start_task(state), task_id=f"{state.task_id}~q", turns=turns, reference_actions=reference
    )


def _row(task, cid):
    return {
        "run_id": "t",
        "candidate_id": cid,
        "signal_id": "s",
        "signal_type": "boundary",
        "context_task_id": task.task_id,
        "source_run": 0,
        "spec": task.to_json(),
        "n_turns": len(task.turns),
        "content_hash": task.content_hash,
    }


def test_filler_wrong_roles_and_failing_goals_are_rejected_with_their_reason(env, states):
    fs = _with_classes(states, "GorillaFileSystem")
    travel = next(
        t for t in states if (t.initial_state["initial_config"].get("TravelAPI") or {}).get("user_first_name")
    )
    user = travel.initial_state["initial_config"]["TravelAPI"]
    vehicle = _with_classes(states, "VehicleControlAPI")
    planted = {
        "filler": _task(
            fs, ["Find every item named 'name 14'."], [[{"name": "find", "arguments": {"name": "name 14"}}]]
        ),
        # a vehicle state's engine status is no city
        "wrong-role": _task(
            vehicle,
            ["Look up the zip code of stopped."],
            [[{"name": "get_zipcode_based_on_city", "arguments": {"city": "stopped"}}]],
        ),
        # every value of its role, but the traveler is a minor: verification_status false is no goal to ask for
        "fails": _task(
            travel,
            ["Verify me as a traveler."],
            [
                [
                    {
                        "name": "verify_traveler_information",
                        "arguments": {
                            "first_name": user["user_first_name"],
                            "last_name": user["user_last_name"],
                            "date_of_birth": "2015-03-04",
                            "passport_number": "US1234567",
                        },
                    }
                ]
            ],
        ),
    }
    out = {
        r["candidate_id"]: r
        for r in validate_rows([_row(t, k) for k, t in planted.items()], [], env, load_config(), None)
    }
    assert out["filler"]["verdict"] == "rejected" and out["filler"]["reason"] == "filler: find.name='name 14'"
    assert out["wrong-role"]["reason"] == "wrong role: get_zipcode_based_on_city.city='stopped' is no known city"
    assert out["fails"]["reason"].startswith(
        "failing goal: turn 0 verify_traveler_information returns verification_status is false"
    )
    assert {rule_of(r["reason"]) for r in out.values()} == {"filler", "wrong role", "failing goal"}


def test_values_of_the_state_and_of_earlier_results_are_of_their_role(env, states):
    trading = _with_classes(states, "TradingBot")
    # AAPL is a key of the state's stocks: a symbol; Apple is a company the backend names
    good = _task(
        trading,
        ["Find Apple's ticker.", "Add it to my watchlist."],
        [
            [{"name": "get_symbol_by_name", "arguments": {"name": "Apple"}}],
            [{"name": "add_to_watchlist", "arguments": {"stock": "AAPL"}}],
        ],
    )
    assert task_problems(env, good) == []
    # a symbol where a company name belongs, a price where an order id belongs
    bad = _task(
        trading,
        ["x"],
        [
            [
                {"name": "get_symbol_by_name", "arguments": {"name": "AAPL"}},
                {"name": "cancel_order", "arguments": {"order_id": 227}},
            ]
        ],
    )
    problems = task_problems(env, bad)
    assert [rule_of(p) for p in problems][:2] == ["wrong role", "failing goal"]
    assert any("cancel_order.order_id=227" in p for p in problems)


def test_a_good_multi_turn_task_refers_to_earlier_turns_and_is_accepted(env, states):
    fs = start_task(_with_classes(states, "GorillaFileSystem"))
    docs = {d["name"]: d for d in env.function_docs(fs)}
    # explored steps: list, enter the first folder the listing shows, create a folder, copy a file in
    ep = env.episode(fs)
    obs = ep.step(ToolCall("ls", {}))
    steps = [("ls", {}, obs.content, None)]
    folder = next(n for n in json.loads(obs.content)["current_directory_content"] if "." not in n)
    for name, args in [("cd", {"folder": folder}), ("mkdir", {"dir_name": "drafts"}), ("ls", {})]:
        obs = ep.step(ToolCall(name, args))
        steps.append((name, args, obs.content, env.observation_error(obs)))
    inside = json.loads(steps[-1][2])["current_directory_content"]
    some_file = next(n for n in inside if "." in n)
    for name, args in [
        ("cp", {"source": some_file, "destination": "drafts"}),
        ("cd", {"folder": "drafts"}),
        ("ls", {}),
    ]:
        obs = ep.step(ToolCall(name, args))
        steps.append((name, args, obs.content, env.observation_error(obs)))
    assert all(e is None for *_, e in steps)
    rows = [
        {"step": i, "action_name": n, "action_args": json.dumps(a), "observation": o, "error": e}
        for i, (n, a, o, e) in enumerate(steps)
    ]
    run = Run("s1", "boundary", 0, fs, rows, docs)
    ((turns, reference),) = TemplateAbstractor(load_config(overrides={"abstract.max_turns": 4})).abstract([run])
    assert len(turns) >= 2
    text = " ".join(turns)
    assert "the folder you just created" in text  # drafts, made in an earlier turn
    task = dataclasses.replace(fs, task_id=f"{fs.task_id}~good", turns=turns, reference_actions=reference)
    assert task_problems(env, task) == []
    (out,) = validate_rows([_row(task, "good")], [], env, load_config(), None)
    assert out["verdict"] == "accepted", out["reason"]


@pytest.mark.parametrize("class_name", sorted(bfcl_data.CLASSES))
def test_the_picker_never_returns_a_value_of_another_role(env, states, class_name):
    """Property: over every BFCL tool, from several states and seeds, a picked value passes the
    same role rule the gate applies, and none is filler."""
    table = env.value_roles()
    chosen = [t for t in states if class_name in t.initial_state["involved_classes"]][:4]
    assert chosen
    checked = 0
    for state in chosen:
        pool = ValuePool(table)
        pool.harvest(env.state_data(state.initial_state), "state")
        for doc in env.function_docs(state):
            if doc["name"] not in {d["name"] for d in bfcl_data.class_docs(class_name)}:
                continue
            for p in param_roles(doc, table):
                for seed in range(12):
                    value = pool.pick(p, random.Random(seed), function=doc["name"])
                    if value is None:  # nothing of that role is known in this state: the call is not made
                        continue
                    checked += 1
                    assert not is_filler(value), (doc["name"], p.name, value)
                    assert role_problem(p, value, pool, doc["name"]) is None, (doc["name"], p.name, value)
    assert checked > 0


def test_a_task_from_the_pool_format_round_trips_through_the_gate(env, states):
    fs = _with_classes(states, "GorillaFileSystem")
    task = Task.from_json(_task(fs, ["Show me where I am."], [[{"name": "pwd", "arguments": {}}]]).to_json())
    assert quality_reason(env, task) is None


def _stocks(state) -> dict:
    return state.initial_state["initial_config"]["TradingBot"]["stocks"]


def test_requests_no_user_would_make_are_odd_and_reversed_changes_undone(env, states):
    trading = next(t for t in states if (t.initial_state["initial_config"].get("TradingBot") or {}).get("stocks"))
    stocks = _stocks(trading)
    cheap, dear = (
        sorted(stocks, key=lambda s: stocks[s]["price"])[0],
        sorted(stocks, key=lambda s: stocks[s]["price"])[-1],
    )
    # Buy the cheapest stock at the dearest one's price: every value of its role, no user's order
    at_other_price = _task(
        trading,
        [f"Buy 10 shares of {cheap} at {stocks[dear]['price']}."],
        [
            [
                {
                    "name": "place_order",
                    "arguments": {"order_type": "Buy", "symbol": cheap, "price": stocks[dear]["price"], "amount": 10},
                }
            ]
        ],
    )
    near_price = _task(
        trading,
        [f"Buy 10 shares of {cheap} at {stocks[cheap]['price']}."],
        [
            [
                {
                    "name": "place_order",
                    "arguments": {"order_type": "Buy", "symbol": cheap, "price": stocks[cheap]["price"], "amount": 10},
                }
            ]
        ],
    )
    added_then_removed = _task(
        trading,
        [f"Add {cheap} to my watchlist and remove it again."],
        [
            [
                {"name": "add_to_watchlist", "arguments": {"stock": cheap}},
                {"name": "remove_stock_from_watchlist", "arguments": {"symbol": cheap}},
            ]
        ],
    )
    assert [rule_of(p) for p in task_problems(env, at_other_price)] == ["odd request"]
    assert f"far from {cheap}'s price" in task_problems(env, at_other_price)[0]
    assert task_problems(env, near_price) == []
    assert task_problems(env, added_then_removed) == [
        "undone: turn 0 add_to_watchlist is reversed by a later call of the turn"
    ]
    fs = start_task(_with_classes(states, "GorillaFileSystem"))
    # creating a file, then writing into it (echo would create it too): no reversal
    touch_echo = _task(
        fs,
        ["Create notes.txt and write 'hello' into it."],
        [
            [
                {"name": "touch", "arguments": {"file_name": "notes.txt"}},
                {"name": "echo", "arguments": {"content": "hello", "file_name": "notes.txt"}},
            ]
        ],
    )
    assert task_problems(env, touch_echo) == []
    # a file moved into a folder of the current folder is a move; to a name found elsewhere, a rename no one asked for
    ep = env.episode(fs)
    here = json.loads(ep.step(ToolCall("ls", {})).content)["current_directory_content"]
    folder = next(n for n in here if "." not in n)
    moved = _task(
        fs,
        [f"Create a.txt and move it to {folder}."],
        [
            [
                {"name": "touch", "arguments": {"file_name": "a.txt"}},
                {"name": "mv", "arguments": {"source": "a.txt", "destination": folder}},
            ]
        ],
    )
    assert task_problems(env, moved) == []
    inside = json.loads(env.episode(fs).step(ToolCall("find", {"path": folder})).content)["matches"]
    elsewhere = next(p.rsplit("/", 1)[-1] for p in inside if p.rsplit("/", 1)[-1] not in here)
    renamed = _task(
        fs,
        ["x"],
        [
            [
                {"name": "touch", "arguments": {"file_name": "a.txt"}},
                {"name": "mv", "arguments": {"source": "a.txt", "destination": elsewhere}},
            ]
        ],
    )
    odd = [p for p in task_problems(env, renamed) if rule_of(p) == "odd request"]
    assert len(odd) == 1 and "a name found elsewhere" in odd[0], odd


def test_a_price_is_picked_near_the_stock_the_call_names(env, states):
    trading = next(t for t in states if (t.initial_state["initial_config"].get("TradingBot") or {}).get("stocks"))
    stocks = _stocks(trading)
    pool = ValuePool(env.value_roles())
    pool.harvest(env.state_data(trading.initial_state), "state")
    doc = next(d for d in env.function_docs(trading) if d["name"] == "place_order")
    price = next(p for p in param_roles(doc, env.value_roles()) if p.name == "price")
    for symbol in stocks:
        for seed in range(5):
            value = pool.pick(price, random.Random(seed), function="place_order", context={"stock_symbol": [symbol]})
            assert abs(value / stocks[symbol]["price"] - 1) <= 0.03 + 1e-9, (symbol, value)
    # without a symbol to bind to, a price still comes from the state's prices
    assert pool.pick(price, random.Random(0), function="place_order") is not None


def test_things_the_task_made_are_referred_to_never_quoted_by_their_new_ids(env, states):
    ticket = start_task(_with_classes(states, "TicketAPI"))
    docs = {d["name"]: d for d in env.function_docs(ticket)}
    ep = env.episode(ticket)
    steps = []
    for name, args in [
        ("ticket_login", {"username": "emma_ops", "password": "Blue#123x"}),
        ("create_ticket", {"title": "Login issue"}),
        ("create_ticket", {"title": "Refund request"}),
    ]:
        obs = ep.step(ToolCall(name, args))
        steps.append((name, args, obs.content, env.observation_error(obs)))
    first, second = (json.loads(content)["id"] for _, _, content, _ in steps[1:])
    for name, args in [
        ("edit_ticket", {"ticket_id": second, "updates": {"priority": 4}}),
        ("get_ticket", {"ticket_id": first}),
    ]:
        obs = ep.step(ToolCall(name, args))
        steps.append((name, args, obs.content, env.observation_error(obs)))
    assert all(e is None for *_, e in steps)
    rows = [
        {"step": i, "action_name": n, "action_args": json.dumps(a), "observation": o, "error": e}
        for i, (n, a, o, e) in enumerate(steps)
    ]
    ((turns, reference),) = TemplateAbstractor(load_config(overrides={"abstract.max_turns": 1})).abstract(
        [Run("s1", "boundary", 0, ticket, rows, docs)]
    )
    text = " ".join(turns)
    assert "the second ticket you created" in text and "the first ticket you created" in text, text
    assert f"ticket {first}" not in text and f"ticket {second}" not in text, text


def test_questions_whose_answer_is_in_them_are_odd():
    from coevolve.envs.bfcl_requests import request_problem

    assert request_problem({}, "sum_values", {"numbers": [62.0]}) == "sum_values of 1 number(s)"
    assert request_problem({}, "sum_values", {"numbers": [62.0, 8.5]}) is None
    assert request_problem({}, "round_number", {"number": 62.0}) is not None
    assert request_problem({}, "round_number", {"number": 62.25, "decimal_places": 1}) is None
    assert request_problem({}, "absolute_value", {"number": 4.0}) is not None
    assert request_problem({}, "absolute_value", {"number": -4.0}) is None
