"""The ``random`` explorer: the paper's random-exploration baseline for ablations.

It ignores the signals: ``explore`` gives it as many contexts as there were signals, on
uniformly drawn pool tasks, and at every step it calls a uniformly drawn tool of the task.
Arguments are filled like the ``rule`` explorer's, from the function docs, the state and
the observations (not from the reference calls or any failed attempt), so that the
baseline differs from guided exploration only in where and what it explores.
"""

from __future__ import annotations

from coevolve.envs.base import ToolCall
from coevolve.explore import Session
from coevolve.explorers.rule import RuleExplorer
from coevolve.registry import register


@register("explorer", "random")
class RandomExplorer(RuleExplorer):
    signal_guided = False

    def _choose_function(self, s: Session) -> str | ToolCall:
        return s.rng.choice(s.memory["tools"])
