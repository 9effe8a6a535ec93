"""The base of every crash explanation (E codes) and the loop that picks the one that applies.

An explanation is a ``Check`` with ``scope = "explain"``: ``match(crash)`` recognises the
error from its type and message (a pure function of text, so ``nndoctor explain`` works on
a pasted log) and returns the parsed facts; ``build(crash, facts)`` adds what the live run
knows (module, shapes, samples, source) and writes the finding. Explanations are tried in
``order`` (specific before generic); the first that matches explains the crash.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any, ClassVar

from nndoctor.commands.explain.crash import Crash
from nndoctor.core.findings import Finding, Severity
from nndoctor.core.registry import Check, is_enabled, load_families, note_variant, registered_checks


class CrashExplanation(Check):
    """Base class: one subclass per E code (registered in the family modules).

    The same cause raised by another framework (TensorFlow's OOM is E108, like PyTorch's)
    is a *variant*: a class with the owner's code and name, added with ``variant`` instead of
    ``register``. It is tried like any explanation and its "What it does" and "References"
    are shown in the owner's documentation, so each code keeps one catalog entry. The owner
    may be a check of any family: K101's Keras check, P113's perf check and X110's distributed
    check have variants that read their cause from a log.
    """

    scope: ClassVar[str] = "explain"
    severity: ClassVar[Severity] = Severity.ERROR
    # Lower runs first: an explanation whose pattern is a special case of another's goes first.
    order: ClassVar[int] = 100
    # Regular expressions over ``crash.text``; the first that matches gives the facts.
    patterns: ClassVar[tuple[str, ...]] = ()
    # Wordings that identify the cause on one log line with no Python exception (a C++ logger's
    # line, a launcher's, a loader's); ``warning_lines``: warnings that name it. Each is written
    # for one real wording (no named groups), and a line that carries it must still pass
    # ``match`` (``explain.logscan``).
    log_lines: ClassVar[tuple[str, ...]] = ()
    warning_lines: ClassVar[tuple[str, ...]] = ()
    # Wordings that, anywhere in the log, show that one of ``warning_lines`` does not apply to this
    # run (Lightning prints its tensor-core note even when it trains in bfloat16): the warning is
    # then not reported.
    log_contradictions: ClassVar[tuple[str, ...]] = ()
    # Lines after such a line that continue its message (dynamo's "function: …", "last reason: …").
    log_context_lines: ClassVar[int] = 0
    # May the log lines printed before an exception (``crash.preamble``) alone supply the wording?
    # Yes for the lines a crash prints on its way (a CUDA kernel's assertion); no for a warning
    # or a start-up line, which says nothing about the exception that follows it.
    preamble_evidence: ClassVar[bool] = True

    @classmethod
    def match(cls, crash: Crash) -> dict[str, Any] | None:
        text = crash.text if cls.preamble_evidence else f"{crash.exc_type}: {crash.message}"
        for pattern in cls.patterns:
            found = re.search(pattern, text, re.S)
            if found:
                return {k: v for k, v in found.groupdict().items() if v is not None}
        return None

    @classmethod
    def build(cls, crash: Crash, facts: dict[str, Any]) -> Finding:  # pragma: no cover - abstract
        # Every registered explanation overrides this; reaching it is a programming error.
        raise TypeError(f"{cls.__name__} must define build()")

    @classmethod
    def make(cls, crash: Crash, message: str, *, fix: str | None = None,
             evidence: dict[str, Any] | None = None) -> Finding:
        """A finding at the user's line, with the run's step when the crash is live."""
        finding = cls.finding(message, location=crash.location, evidence=evidence, fix=fix)
        step = crash.context.get("step")
        if step is None and crash.session is not None:
            step = crash.session.step
        finding.first_step = step
        return finding


_VARIANTS: list[type[CrashExplanation]] = []


def variant(cls: type[CrashExplanation]) -> type[CrashExplanation]:
    """Class decorator: another explanation of a registered code (see ``CrashExplanation``)."""
    if all(existing.__qualname__ != cls.__qualname__ for existing in _VARIANTS):
        _VARIANTS.append(cls)
    note_variant(cls)
    return cls


# The families that define crash explanations: `nndoctor explain` imports these only, not the
# runtime checks (which import torch: seconds before a pasted log is even read).
EXPLANATION_FAMILIES = ("nndoctor.commands.explain.checks", "nndoctor.commands.env.checks")


def _explanation_classes() -> list[type[Check]]:
    load_families(EXPLANATION_FAMILIES)
    return registered_checks()


def variants_of(code: str) -> list[type[CrashExplanation]]:
    load_families(EXPLANATION_FAMILIES)  # variants live in the explanation modules
    return [v for v in _VARIANTS if v.code == code]


def explanations(select: Iterable[str] = (), ignore: Iterable[str] = ()) -> list[type[CrashExplanation]]:
    """The enabled explanation classes, in the order they are tried."""
    select, ignore = list(select), list(ignore)
    # Any scope: the install checks of ``nndoctor env`` also explain the crashes they cause.
    found = [c for c in _explanation_classes() if issubclass(c, CrashExplanation) and c.patterns
             and is_enabled(c, select, ignore)]
    found += [v for v in _VARIANTS if v.patterns and is_enabled(v, select, ignore)]
    return sorted(found, key=lambda c: (c.order, c.code))


def explain(crash: Crash, *, select: Iterable[str] = (), ignore: Iterable[str] = (),
            failures: list[tuple[str, BaseException]] | None = None) -> Finding | None:
    """The first explanation that matches ``crash``, or None (no known cause).

    Gathering live evidence reads user objects and may fail in ways text parsing cannot;
    such a failure is recorded in ``failures`` and the explanation is rebuilt from the
    message alone, so the user still gets the cause and the fix.
    """
    for cls in explanations(select, ignore):
        facts = cls.match(crash)
        if facts is None:
            continue
        try:
            return cls.build(crash, facts)
        except Exception as error:  # noqa: BLE001 - degrade to the text-only explanation
            if failures is not None:
                failures.append((f"{cls.code} evidence", error))
            if not crash.is_live:
                raise
            text_only = Crash(exc_type=crash.exc_type, message=crash.message, frames=crash.frames,
                              worker_frames=crash.worker_frames, preamble=crash.preamble)
            return cls.build(text_only, facts)
    return None
