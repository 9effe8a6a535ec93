"""The check registry: the Check base class, registration, and catalog lookup.

A check is one small class. Its class attributes are its catalog entry (code, name,
severity, summary, fix); its docstring is its long documentation under fixed headings
(What it does / Why is this bad? / Example / Use instead / References), printed by
``nndoctor checks CODE``. A runtime check subscribes to events by defining methods
named ``on_<event kind>`` (``on_forward``, ``on_step_start`` …); the engine calls only
those, and only for enabled checks. Checks never install hooks themselves: a check that
reads a probe's records names the probe in ``needs`` (``nndoctor.core.probes``), and the
instrumentation installs it only when an enabled check asks.
"""

from __future__ import annotations

import importlib
import inspect
import re
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, ClassVar

# re-exported: checks import them from here
from nndoctor.catalog.table import build_finding, merge_variant_doc, rule
from nndoctor.catalog.table import is_enabled as is_enabled
from nndoctor.catalog.table import unknown_selectors as unknown_selectors
from nndoctor.core.events import EVENT_KINDS
from nndoctor.core.findings import Finding, Location, Severity
from nndoctor.core.probes import probes_of_scope
from nndoctor.core.subscribers import handler_names, stray_handlers

if TYPE_CHECKING:
    from nndoctor.core.engine import Session

DOC_HEADINGS = ("What it does", "Why is this bad?", "Example", "Use instead", "References")

# Families of checks, by the subcommand that runs them. Modules listed here register their
# checks on import; adding a family means adding its module here, nothing else.
CHECK_MODULES = (
    "nndoctor.checks",
    "nndoctor.commands.explain.checks",
    "nndoctor.commands.data.checks",
    "nndoctor.commands.ckpt.checks",
    "nndoctor.commands.perf.checks",
    "nndoctor.commands.env.checks",
    "nndoctor.keras.checks",
    "nndoctor.commands.preflight.checks",
    "nndoctor.tfdata.checks",
    "nndoctor.keras.loop_checks",
    "nndoctor.keras.data_variants",
    "nndoctor.keras.training_variants",
)

# Frameworks a family may need; without them the family is left out instead of failing.
OPTIONAL_FRAMEWORKS = ("torch", "torchvision", "tensorflow", "keras")
# The families that define the checks of a scope other than "run": the Keras and tf.data
# observers load these only, not the PyTorch families (which import torch, ~3 s of CPU that a
# TensorFlow script's run, or each of its ``perf --try`` re-runs, would pay for nothing).
SCOPE_FAMILIES = {"keras": ("nndoctor.keras.checks", "nndoctor.keras.loop_checks", "nndoctor.keras.data_variants",
                            "nndoctor.keras.training_variants"),
                  "tfdata": ("nndoctor.tfdata.checks",)}

_REGISTRY: dict[str, type[Check]] = {}
# Other classes of a registered code, by code (``note_variant``), in the order they were added.
_VARIANTS: dict[str, list[type[Check]]] = {}
_CODE_RE = re.compile(r"^[A-Z][0-9]{3}$")


class Check:
    """Base class of every diagnosis. Subclasses set the class attributes below."""

    code: ClassVar[str]
    name: ClassVar[str]
    severity: ClassVar[Severity]
    summary: ClassVar[str]
    fix: ClassVar[str]
    # "run" checks see runtime events; "data", "ckpt", "perf" and "explain" checks are
    # produced by their subcommands and only use the metadata and ``finding()``.
    scope: ClassVar[str] = "run"
    # Heuristic checks decide from a threshold on measured statistics and state their evidence
    # and threshold in the message; ``false_positives`` says how often they fire wrongly, as
    # measured (rate, data and benchmark). ``nndoctor checks CODE`` prints both, SARIF tags them.
    heuristic: ClassVar[bool] = False
    false_positives: ClassVar[str | None] = None
    # Probes (names in ``nndoctor.core.probes.PROBES``, or ``KERAS_PROBES`` for the scopes "keras" and
    # "tfdata") whose records this check reads; events
    # are declared by the ``on_<kind>`` methods instead.
    needs: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, session: Session) -> None:
        self.session = session

    # -- emitting ----------------------------------------------------------------
    def report(
        self,
        message: str,
        *,
        location: Location | None = None,
        evidence: dict[str, Any] | None = None,
        fix: str | None = None,
        severity: Severity | None = None,
        step: int | None = None,
        count: int = 1,
    ) -> Finding:
        """Record a finding for this check in the session's report (merged by place)."""
        finding = self.finding(
            message, location=location, evidence=evidence, fix=fix, severity=severity
        )
        finding.first_step = step
        finding.count = count
        return self.session.add_finding(finding)

    @classmethod
    def finding(
        cls,
        message: str,
        *,
        location: Location | None = None,
        evidence: dict[str, Any] | None = None,
        fix: str | None = None,
        severity: Severity | None = None,
    ) -> Finding:
        """Build a Finding of this check without a session (for data/ckpt/explain)."""
        return build_finding(cls, message, location=location, evidence=evidence, fix=fix, severity=severity)

    # -- documentation -----------------------------------------------------------
    @classmethod
    def documentation(cls) -> str:
        """The docstring; a registered check's also gets its variants' "What it does" and
        "References" (the same cause explained from another angle: ``explain.base.variant``)."""
        own = inspect.cleandoc(cls.__doc__ or "")
        if get_check(cls.code) is not cls:
            return own
        for extra in _VARIANTS.get(cls.code, ()):
            own = merge_variant_doc(own, inspect.cleandoc(extra.__doc__ or ""))
        return own

    @classmethod
    def doc_sections(cls) -> dict[str, str]:
        """The docstring split under its ``## Heading`` lines."""
        sections: dict[str, str] = {}
        current: str | None = None
        lines: list[str] = []
        for line in cls.documentation().splitlines():
            match = re.match(r"^##\s+(.*?)\s*$", line)
            if match:
                if current is not None:
                    sections[current] = "\n".join(lines).strip()
                current, lines = match.group(1), []
            elif current is not None:
                lines.append(line)
        if current is not None:
            sections[current] = "\n".join(lines).strip()
        return sections

    @classmethod
    def handlers(cls) -> dict[str, str]:
        """Event kind -> method name, for every ``on_<kind>`` this check defines."""
        return handler_names(cls)

    @property
    def subscriber_name(self) -> str:
        return f"{self.code} {self.name}"


def register(cls: type[Check]) -> type[Check]:
    """Class decorator: add a check to the catalog. Codes are unique and stable."""
    code = cls.code
    if not _CODE_RE.match(code):
        raise ValueError(f"bad check code {code!r}")
    _validate(cls)
    existing = _REGISTRY.get(code)
    if existing is not None and existing.__qualname__ != cls.__qualname__:
        raise ValueError(f"check code {code} registered twice ({existing.__name__}, {cls.__name__})")
    _REGISTRY[code] = cls
    return cls


def _validate(cls: type[Check]) -> None:
    # A misspelt handler (``on_fowrard``) would never be called: the check would stay silent.
    stray = stray_handlers(cls)
    if stray:
        raise TypeError(f"{cls.__name__} ({cls.code}) defines {', '.join(stray)}, which match no event kind "
                        f"(known: {', '.join(sorted(EVENT_KINDS))})")
    # A check names the probes of its own observer (a Keras check cannot need a torch probe).
    known = probes_of_scope(cls.scope)
    unknown = sorted(set(cls.needs) - set(known))
    if unknown:
        raise ValueError(f"{cls.code} needs unknown probe(s) {unknown}; known for scope {cls.scope!r}: {sorted(known)}")


_CATALOG_FIELDS = ("name", "severity", "summary", "fix", "heuristic", "false_positives")


def register_variant(cls: type[Check]) -> type[Check]:
    """Class decorator: another framework's check of a code that a registered check owns (N101
    on Keras, D105 on a tf.data pipeline). It shares that code's one catalog entry: its name,
    severity, summary and fix come from the catalog table (no import of the owner's module, so
    a TensorFlow-only install works), and ``--select``/``--ignore`` treat it as the owner. Its
    ``scope`` says which framework observer enables it (``framework_checks``); its handlers and
    ``needs`` are validated as ``register`` validates a check's."""
    entry = rule(cls.code)
    for name in _CATALOG_FIELDS:
        if name not in cls.__dict__:
            setattr(cls, name, getattr(entry, name))
    _validate(cls)
    note_variant(cls)
    return cls


def framework_checks(scope: str, select: Iterable[str] = (), ignore: Iterable[str] = ()) -> list[type[Check]]:
    """The enabled checks a framework observer adds to its session (``Session.add_checks``): the
    registered checks of its scope ("keras", "tfdata"), then the variants of shared codes it runs."""
    select, ignore = list(select), list(ignore)
    owned = enabled_checks(select, ignore, scope)
    shared = [v for known in _VARIANTS.values() for v in known
              if v.scope == scope and is_enabled(v, select, ignore)]
    return owned + sorted(shared, key=lambda v: v.code)


def load_all() -> None:
    load_families(CHECK_MODULES)


def load_families(modules: Iterable[str]) -> None:
    """Import the given families of CHECK_MODULES (a family that needs a missing framework is
    left out): a command that needs some families only does not pay the others' imports."""
    for module in modules:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as error:
            # A family whose package is not there yet, or whose framework is not installed
            # (the PyTorch run checks without torch), is simply absent from the catalog.
            missing = (error.name or "").split(".")[0]
            if error.name is None or not (module.startswith(error.name) or missing in OPTIONAL_FRAMEWORKS):
                raise


def note_variant(cls: type[Check]) -> None:
    """Record ``cls`` as a variant of its code's check, for that check's documentation."""
    known = _VARIANTS.setdefault(cls.code, [])
    if all(existing.__qualname__ != cls.__qualname__ for existing in known):
        known.append(cls)


def registered_checks() -> list[type[Check]]:
    """The checks registered so far (no import), sorted by code: what the catalog table is built from."""
    return sorted(_REGISTRY.values(), key=lambda c: c.code)


def all_checks(scope: str | None = None) -> list[type[Check]]:
    if scope is not None and scope in SCOPE_FAMILIES:
        load_families(SCOPE_FAMILIES[scope])
    else:
        load_all()
    checks = sorted(_REGISTRY.values(), key=lambda c: c.code)
    return [c for c in checks if scope is None or c.scope == scope]


def get_check(code_or_name: str) -> type[Check] | None:
    load_all()
    key = code_or_name.strip()
    if key.upper() in _REGISTRY:
        return _REGISTRY[key.upper()]
    for cls in _REGISTRY.values():
        if cls.name == key.lower():
            return cls
    return None


def parse_codes(text: str | Iterable[str] | None) -> list[str]:
    """``"M101,O1"`` -> ``["M101", "O1"]``; accepts codes, prefixes, names or ``ALL``."""
    if text is None:
        return []
    parts = text.split(",") if isinstance(text, str) else [p for t in text for p in t.split(",")]
    return [p.strip() for p in parts if p.strip()]


def enabled_checks(
    select: Iterable[str] = (), ignore: Iterable[str] = (), scope: str | None = "run"
) -> list[type[Check]]:
    select, ignore = list(select), list(ignore)
    return [c for c in all_checks(scope) if is_enabled(c, select, ignore)]
