"""Rendering a KernelPlan through a dialect template (which extends the shared ``kernel.j2``)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import jinja2

from roller.backends.c_family.plan import Dialect, KernelPlan

_SHARED = Path(__file__).parent / "templates"
_ENVS: dict[str, jinja2.Environment] = {}


def environment(template_dir: Path) -> jinja2.Environment:
    key = str(template_dir)
    if key not in _ENVS:
        _ENVS[key] = jinja2.Environment(
            loader=jinja2.FileSystemLoader([str(template_dir), str(_SHARED)]),
            undefined=jinja2.StrictUndefined, keep_trailing_newline=True, trim_blocks=False,
            autoescape=False)
    return _ENVS[key]


def render(plan: KernelPlan, dialect: Dialect, template_dir: Path, template: str, **extra: Any) -> str:
    env = environment(template_dir)

    def from_acc(ctype: str, x: str) -> str:
        """The accumulator's value ``x`` stored as ``ctype``: a typed body's by its own rules (plan/typed.py)."""
        if plan.typed_store is not None:
            return plan.typed_store(ctype, x)
        return dialect.store(ctype, x)

    def pad_of(ctype: str) -> str:
        """The pad value as an input tile's element (``ctype``), for the points outside the tensor."""
        return dialect.store(ctype, plan.pad_value)

    # ``split`` (a split-K form, CUDA only) is off unless a dialect's backend passes one
    text = env.get_template(template).render(p=plan, from_acc=from_acc, pad_of=pad_of,
                                            dialect_stage_vector=dialect.stage_vector,
                                            **{"split": None, **extra})
    # Templates keep their structure readable; the generated file drops the blank lines that leaves.
    return "\n".join(line for line in text.splitlines() if line.strip()) + "\n"
