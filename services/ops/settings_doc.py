"""Every setting of every service as a table: `voice-agent config` and docs/configuration.md.

Field descriptions are the one-line docstrings under each field, read from the source.
"""

from __future__ import annotations

import ast
import inspect
import itertools
from typing import Any

from pydantic import BaseModel

from services.ops.registry import SERVICES


def _docstrings(model: type[BaseModel]) -> dict[str, str]:
    docs: dict[str, str] = {}
    for cls in reversed(model.__mro__):
        if not (isinstance(cls, type) and issubclass(cls, BaseModel)) or cls is BaseModel:
            continue
        try:
            tree = ast.parse(inspect.getsource(cls))
        except (OSError, TypeError):
            continue
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for field, nxt in itertools.pairwise(body):
            if (
                isinstance(field, ast.AnnAssign)
                and isinstance(field.target, ast.Name)
                and isinstance(nxt, ast.Expr)
                and isinstance(nxt.value, ast.Constant)
                and isinstance(nxt.value.value, str)
            ):
                docs[field.target.id] = " ".join(nxt.value.value.split())
    return docs


def rows(model: type[BaseModel], instance: BaseModel, prefix: str) -> list[tuple[str, str, str]]:
    """(environment variable, default, meaning) for every leaf setting under `model`."""
    docs = _docstrings(model)
    out: list[tuple[str, str, str]] = []
    for name, field in model.model_fields.items():
        value: Any = getattr(instance, name)
        env = f"{prefix}{name.upper()}"
        if isinstance(value, BaseModel):
            out.extend(rows(type(value), value, f"{env}__"))
            continue
        bounds = [
            f"{key} {getattr(m, key)}"
            for m in field.metadata
            for key in ("ge", "le", "gt", "lt")
            if getattr(m, key, None) is not None
        ]
        meaning = docs.get(name, "")
        if bounds:
            meaning += f" ({', '.join(bounds)})"
        out.append((env, "" if value is None else str(value), meaning))
    return out


def markdown() -> str:
    """docs/configuration.md."""
    lines = [
        "# Configuration",
        "",
        "Every service reads its settings from the environment: prefix `VA_`, nested",
        "sections joined by `__`. Numbers are bounded; a value out of bounds stops the",
        "service at start-up with a message naming the setting. This page is generated",
        "by `voice-agent config --markdown` (a test keeps it current).",
        "",
    ]
    seen: set[str] = set()
    for service, entry in SERVICES.items():
        model = entry.settings
        lines += [f"## {service}", "", "| variable | default | meaning |", "|---|---|---|"]
        for env, default, meaning in rows(model, model.model_construct(), "VA_"):
            shared = env in seen
            seen.add(env)
            note = " (shared)" if shared else ""
            lines.append(f"| `{env}` | `{default}` | {meaning}{note} |")
        lines.append("")
    return "\n".join(lines)
