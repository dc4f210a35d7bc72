"""Abstractor plug-ins (registry kind ``"abstractor"``): ``template`` and ``llm``."""

from coevolve.abstractors import llm, template  # noqa: F401
