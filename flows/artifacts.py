"""Prefect artifact keys: the one slug every flow names its artifacts with.

    artifact_key("coevolve", "tiny", "round", 1)          # 'coevolve-tiny-round-1'
    artifact_key("ablation", "/tmp/abl")                  # 'ablation-tmp-abl'

Prefect keys allow lowercase letters, digits and dashes: each part is lowercased, every run of
other characters becomes one dash, dashes at a part's ends go, and the parts are joined with
dashes; at most 100 characters.
"""

from __future__ import annotations

import re
from typing import Any


def artifact_key(*parts: Any) -> str:
    slugs = (re.sub(r"[^a-z0-9-]+", "-", str(p).lower()).strip("-") for p in parts)
    return "-".join(s for s in slugs if s)[:100]
