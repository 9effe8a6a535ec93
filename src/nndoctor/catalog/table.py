"""The catalog as a static table: every code's metadata without importing any check.

The check classes stay the source of their metadata (code, name, severity, summary, fix and
the docstring); ``catalog/entries.py`` is generated from them. Commands that only need the
catalog — listing, selector validation, configuration files, ``data``, ``ckpt``, findings
of a shared code reported by another family — read this table, so they work without
PyTorch, TensorFlow or Keras installed and never pay for importing them.

After adding, renaming or removing a check, regenerate the table::

    python -m nndoctor.catalog.update --update

(``tests/test_catalog_table.py`` fails with that command when the table is stale.)
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from importlib.machinery import PathFinder
from typing import Any, Protocol

from nndoctor.core.findings import Finding, Location, Severity

UPDATE_COMMAND = "python -m nndoctor.catalog.update --update"


@dataclass(frozen=True)
class Rule:
    """One catalog entry: what a code means, and where the check that owns it lives."""

    code: str
    name: str
    severity: Severity
    scope: str  # the command that reports it: run, explain, data, ckpt, perf, env, keras, preflight
    summary: str
    fix: str
    module: str
    class_name: str
    heuristic: bool = False
    false_positives: str | None = None  # measured rate, for heuristic checks
    # Explanations of the same code for another framework ((module, class name)): their
    # "What it does" and "References" are part of this entry's documentation.
    variants: tuple[tuple[str, str], ...] = ()

    def heuristic_note(self) -> str | None:
        """What ``nndoctor checks CODE`` says about a heuristic check's reliability."""
        if not self.heuristic:
            return None
        measured = self.false_positives or "not measured yet."
        return f"This check decides from a threshold on measured statistics. False positives: {measured}"

    def finding(
        self,
        message: str,
        *,
        location: Location | None = None,
        evidence: dict[str, Any] | None = None,
        fix: str | None = None,
        severity: Severity | None = None,
    ) -> Finding:
        """A Finding of this code, built from the table alone (no framework needed)."""
        return build_finding(self, message, location=location, evidence=evidence, fix=fix, severity=severity)

    # -- the check's source, read without importing it ----------------------------------------
    def source_path(self) -> str | None:
        return module_path(self.module)

    def _class_node(self) -> ast.ClassDef | None:
        path = self.source_path()
        if path is None:
            return None
        return _class_nodes(path).get(self.class_name)

    def source_line(self) -> int | None:
        node = self._class_node()
        return node.lineno if node is not None else None

    def where(self) -> str:
        """``path:line (ClassName)``: where a developer finds the check."""
        path, line = self.source_path(), self.source_line()
        place = f"{path}:{line}" if path and line else (path or self.module)
        return f"{place} ({self.class_name})"

    def documentation(self) -> str:
        """The class docstring (its fixed headings), cleaned as ``inspect.cleandoc`` does, with
        the variants' "What it does" and "References" added."""
        node = self._class_node()
        text = (ast.get_docstring(node, clean=True) or "") if node is not None else ""
        for module, class_name in self.variants:
            path = module_path(module)
            extra = _class_nodes(path).get(class_name) if path else None
            if extra is not None:
                text = merge_variant_doc(text, ast.get_docstring(extra, clean=True) or "")
        return text


def build_finding(
    entry: Any,
    message: str,
    *,
    location: Location | None = None,
    evidence: dict[str, Any] | None = None,
    fix: str | None = None,
    severity: Severity | None = None,
) -> Finding:
    """A Finding of a catalog entry (a ``Rule`` or a check class: both carry the same fields)."""
    return Finding(
        code=entry.code,
        name=entry.name,
        severity=severity or entry.severity,
        message=message,
        fix=fix or entry.fix,
        location=location,
        evidence=dict(evidence or {}),
    )


def doc_sections(text: str) -> dict[str, str]:
    """A docstring split under its ``## Heading`` lines."""
    sections: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        if line.startswith("## "):
            current = sections.setdefault(line[3:].strip(), [])
        elif current is not None:
            current.append(line)
    return {heading: "\n".join(lines).strip() for heading, lines in sections.items()}


def merge_variant_doc(text: str, variant: str) -> str:
    """``text`` (an owner's docstring) with the variant docstring's "What it does" paragraph
    appended to that section and its references appended to "References"."""
    lines = text.splitlines()
    sections = doc_sections(variant)
    for heading in ("What it does", "References"):
        addition = sections.get(heading, "")
        if not addition or f"## {heading}" not in lines:
            continue
        start = lines.index(f"## {heading}") + 1
        end = next((i for i in range(start, len(lines)) if lines[i].startswith("## ")), len(lines))
        while end > start and not lines[end - 1].strip():
            end -= 1
        lines[end:end] = ([""] if heading == "What it does" else []) + addition.splitlines()
    return "\n".join(lines)


class _Named(Protocol):
    # read-only, so that frozen Rules and check classes (class attributes) both qualify
    @property
    def code(self) -> str: ...

    @property
    def name(self) -> str: ...


def module_path(module: str) -> str | None:
    """The source file of ``module`` without importing it or its parent packages.

    ``importlib.util.find_spec("nndoctor.checks.modes")`` would import ``nndoctor.checks``,
    whose ``__init__`` imports every runtime check and so PyTorch; the path finder walks the
    package folders instead.
    """
    parts = module.split(".")
    search: list[str] | None = None
    spec = None
    for depth in range(1, len(parts) + 1):
        spec = PathFinder.find_spec(".".join(parts[:depth]), search)
        if spec is None:
            return None
        search = list(spec.submodule_search_locations or [])
    return spec.origin if spec is not None else None


@lru_cache(maxsize=64)
def _class_nodes(path: str) -> dict[str, ast.ClassDef]:
    try:
        with open(path, encoding="utf-8") as handle:
            tree = ast.parse(handle.read(), filename=path)
    except (OSError, SyntaxError, ValueError):
        return {}
    return {node.name: node for node in ast.walk(tree) if isinstance(node, ast.ClassDef)}


# -- the table ---------------------------------------------------------------------------------
@lru_cache(maxsize=1)
def _rules() -> dict[str, Rule]:
    from nndoctor.catalog.entries import ENTRIES

    rules: dict[str, Rule] = {}
    for entry in ENTRIES:
        fields: dict[str, Any] = dict(entry)
        fields["severity"] = Severity.parse(fields["severity"])
        fields["variants"] = tuple(tuple(v) for v in fields.get("variants", ()))
        rules[fields["code"]] = Rule(**fields)
    return rules


def all_rules(scope: str | None = None) -> list[Rule]:
    """Every catalog entry (of one command's scope), sorted by code."""
    return [r for code, r in sorted(_rules().items()) if scope is None or r.scope == scope]


def scopes() -> list[str]:
    return sorted({r.scope for r in _rules().values()})


def find_rule(code_or_name: str) -> Rule | None:
    """The entry for a code (``M101``, any case) or a name (``eval-in-train-mode``)."""
    key = code_or_name.strip()
    rules = _rules()
    if key.upper() in rules:
        return rules[key.upper()]
    return next((r for r in rules.values() if r.name == key.lower()), None)


def rule(code: str) -> Rule:
    """The entry for a code that must exist (a typo in our own code is a bug: KeyError)."""
    found = _rules().get(code)
    if found is None:
        raise KeyError(f"{code} is not in the catalog table (regenerate it: {UPDATE_COMMAND})")
    return found


# -- selection: --select / --ignore / config files ---------------------------------------------
def matches(check: _Named, selector: str) -> bool:
    """A selector is ``ALL``, a check name, a code or a code prefix (``O1``)."""
    if selector.upper() == "ALL":
        return True
    if selector.lower() == check.name:
        return True
    return check.code.startswith(selector.upper())


def unknown_selectors(selectors: Iterable[str]) -> list[str]:
    """Selectors that match no code of the catalog (a typo in ``--select`` is reported)."""
    rules = list(_rules().values())
    return [s for s in selectors if not any(matches(r, s) for r in rules)]


def is_enabled(check: _Named, select: Iterable[str], ignore: Iterable[str]) -> bool:
    """Whether a check (class or Rule: anything with ``code`` and ``name``) is selected."""
    select = list(select)
    if select and not any(matches(check, s) for s in select):
        return False
    return not any(matches(check, s) for s in ignore)


def code_enabled(code: str, select: Iterable[str], ignore: Iterable[str]) -> bool:
    """``is_enabled`` for a code; a code outside the catalog is never filtered out."""
    found = _rules().get(code)
    return found is None or is_enabled(found, select, ignore)
