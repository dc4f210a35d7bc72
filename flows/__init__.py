"""Prefect flows: thin orchestration over ``coevolve.round``."""
