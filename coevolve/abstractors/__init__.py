"""Abstractor plug-ins (registry kind ``"abstractor"``); ``llm`` lives in ``coevolve.abstract``."""

from coevolve.abstractors import template  # noqa: F401
