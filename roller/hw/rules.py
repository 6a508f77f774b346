"""What each backend asks of the descriptions it serves: the ``backend`` values a description may name, the
form of its ``target``, and the ``parallelism`` keys it must give.

The backends declare these facts (``roller.backends.Backend``); ``scripts/update_schema.py`` writes them into
``roller/hwdesc/schema.json`` (for editors), and the loader reads them from there, so that loading a description
imports no backend. tests/test_structure.py fails when the file and the declarations disagree.
"""
from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from pathlib import Path

SCHEMA_PATH = Path(__file__).resolve().parent.parent / "hwdesc" / "schema.json"


@dataclass(frozen=True)
class BackendRule:
    name: str
    target_pattern: str  # matched in full against a description's target
    target_hint: str  # what such a target looks like, in words (the backend's declaration)
    required_parallelism: tuple[str, ...]

    def matches_target(self, target: str) -> bool:
        return re.fullmatch(self.target_pattern, target) is not None


@functools.cache
def backend_rules() -> dict[str, BackendRule]:
    """Backend name -> its rule, from the schema's per-backend ``if``/``then`` rules."""
    schema = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    out: dict[str, BackendRule] = {}
    for rule in schema.get("allOf", []):
        if not str(rule.get("$comment", "")).startswith("backend "):
            continue
        name = rule["if"]["properties"]["backend"]["const"]
        then = rule["then"]["properties"]
        out[name] = BackendRule(name, then["target"]["pattern"], then["target"]["description"],
                                tuple(then.get("parallelism", {}).get("required", ())))
    return out
