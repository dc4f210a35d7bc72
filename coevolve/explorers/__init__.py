"""Built-in explorers; importing this package registers them (registry kind ``explorer``)."""

from coevolve.explorers import llm, random, rule  # noqa: F401
