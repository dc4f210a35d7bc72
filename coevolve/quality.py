"""The quality gate: would a careful annotator accept this synthesized task?

Validation runs it on every candidate, before the duplicate checks and the two passes; the
``coevolve bench tasks`` report runs it over a whole pool. A task breaks a rule when one of
its reference calls

- carries **schema filler** (``filler``): a parameter's name with a number (``'city 72'``),
  ``item_36``, a placeholder no user would write (``coevolve.roles.is_filler``);
- has a value of the **wrong role** (``wrong role``): "log in as Open with password NVDA"; a
  value must have been seen with the parameter's role before the call (in the start state,
  in an earlier call's result, as an earlier call's argument, among the environment's own
  values), be in the parameter's enum, or be a plausible made-up value of a role a task may
  create (a new file name, a message, an amount; ``coevolve.values.role_problem``);
- **fails** (``failing goal``): its result is an error or a failure result ("Stock not
  found", a zip code 00000, a false verification; ``Environment.observation_error``), so the
  instruction would ask for something the reference never achieves;
- is a request **no user would make** in the state it meets (``odd request``: a move that
  would rename, an order far from the stock's price, following oneself;
  ``Episode.request_problem`` where the environment has one);
- **is undone** by its turn (``undone``): a later call of the turn reverses it (a stock added
  to the watchlist and removed again, a deposit and an equal withdrawal; ``reversed_calls``).

    problems = task_problems(env, task)        # [] when the task passes every rule
    reason = quality_reason(env, task)         # the first problem, as a validation reason
"""

from __future__ import annotations

from typing import Any

from coevolve.envs.base import Environment
from coevolve.types import ToolCall
from coevolve.explorers.base import observed_error, result_data
from coevolve.roles import ParamRole, param_roles
from coevolve.reversals import reversed_calls
from coevolve.values import ValuePool, role_problem
from coevolve.tasks import Task

RULES = ("filler", "wrong role", "failing goal", "odd request", "undone")


def rule_of(problem: str) -> str:
    """The rule a problem text breaks (its text before the first colon)."""
    return problem.split(":", 1)[0]


def harvest_result(env: Environment, pool: ValuePool, content: Any, function: str) -> None:
    """Record the values of a call's result under their roles (``explorers.base.result_data``)."""
    doc = result_data(env, content, function) if isinstance(content, str) else content
    if isinstance(doc, (dict, list)):
        pool.harvest(doc, "result", function=function)


def start_pool(env: Environment, task: Task) -> ValuePool:
    """The values of the task's start state, by role (``Environment.value_roles``)."""
    pool = ValuePool(env.value_roles())
    pool.harvest(env.state_data(task.initial_state), "state")
    return pool


def task_problems(env: Environment, task: Task) -> list[str]:
    """Every rule the task's reference calls break, in call order (see the module docstring).

    The calls are replayed in a fresh episode of ``task``, turn by turn, so that each value
    is judged against what the state and the earlier calls had shown when it was used.
    """
    docs = {d["name"]: d for d in env.function_docs(task)}
    table = env.value_roles()
    pool = start_pool(env, task)
    problems: list[str] = []
    try:
        episode = env.episode(task)
    except Exception as exc:  # a spec the environment cannot open is judged elsewhere (pass 1)
        return [f"failing goal: the environment cannot open the task ({type(exc).__name__})"]
    judge = getattr(episode, "request_problem", None)
    for t, calls in enumerate(task.reference_actions):
        episode.user_message(t)
        for call in calls:
            name, args = call.get("name", ""), call.get("arguments") or {}
            odd = judge(ToolCall(name, args)) if judge is not None else None
            if odd:
                problems.append(f"odd request: turn {t} {odd}")
            params: dict[str, ParamRole] = {p.name: p for p in param_roles(docs.get(name, {}), table)}
            for key, value in args.items():
                p = params.get(key)
                if p is None:
                    problems.append(f"wrong role: {name}.{key} is no parameter of {name}")
                    continue
                problem = role_problem(p, value, pool, name)
                if problem:
                    problems.append(problem)
            obs = episode.step(ToolCall(name, args))
            error = observed_error(obs, env)
            if error:
                problems.append(f"failing goal: turn {t} {name} returns {error[:160]}")
                continue
            harvest_result(env, pool, obs.content, name)
            for key, value in args.items():
                if key in params:
                    for v in value if isinstance(value, list) else [value]:
                        pool.add(params[key].role, v, "arg")
        episode.end_turn()
    return problems + undone_calls(env, task)


def undone_calls(env: Environment, task: Task) -> list[str]:
    """The ``undone`` problems of ``task`` (module docstring), turn by turn."""
    problems: list[str] = []
    done: list[dict[str, Any]] = []  # the calls of the earlier turns
    for t, calls in enumerate(task.reference_actions):
        for i in reversed_calls(env, task, done, calls):
            problems.append(f"undone: turn {t} {calls[i].get('name', '')} is reversed by a later call of the turn")
        done += calls
    return problems


def quality_reason(env: Environment, task: Task) -> str | None:
    """The first rule ``task`` breaks, as a ``candidates`` reason, or None."""
    problems = task_problems(env, task)
    return problems[0][:300] if problems else None
