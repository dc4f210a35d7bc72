"""The ``random`` explorer: the paper's random-exploration baseline for ablations.

It ignores the signals: ``explore`` gives it exactly as many contexts as the signal-guided
explorer would get (signal contexts plus the cold-start fallback), on uniformly drawn pool
tasks, with the same runs per context and steps per run. At every step it calls a uniformly
drawn tool of the task; arguments are filled exactly like the ``rule`` explorer's, from the
function docs, the start state and the run's observations, and after an error it retries
the same function with other values as the ``rule`` explorer does. So the baseline differs
from guided exploration only in where it starts and what it calls.
"""

from __future__ import annotations

from coevolve.types import ToolCall
from coevolve.explorers.base import Session
from coevolve.explorers.rule import RuleExplorer
from coevolve.registry import register


@register("explorer", "random")
class RandomExplorer(RuleExplorer):
    signal_guided = False

    def _choose_function(self, s: Session) -> str | ToolCall:
        if s.memory["retry"]:  # the same retry logic as the guided explorer
            return s.memory["retry"]
        return s.rng.choice(s.memory["tools"])
