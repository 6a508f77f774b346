"""Write the backend rules of roller/hwdesc/schema.json from the backends' declarations.

    .venv/bin/python scripts/update_schema.py

The schema is for editors (yaml-language-server); the loader is the authority. Its ``backend`` values and its
per-backend rules (target pattern, required parallelism keys) come from ``roller.backends.schema_rules()``,
so that a new backend is declared in one place; tests/test_structure.py fails when the file is stale.
"""
from __future__ import annotations

import json

from roller.backends import schema_rules
from roller.hw import SCHEMA_PATH


def updated(schema: dict) -> dict:
    names, rules = schema_rules()
    schema["properties"]["backend"] = {"enum": names}
    kept = [r for r in schema.get("allOf", []) if not str(r.get("$comment", "")).startswith("backend ")]
    schema["allOf"] = kept + rules
    return schema


if __name__ == "__main__":
    doc = updated(json.loads(SCHEMA_PATH.read_text()))
    SCHEMA_PATH.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {SCHEMA_PATH}")
