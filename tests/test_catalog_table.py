"""The static catalog table agrees with the registered checks, and stands in for them."""

from __future__ import annotations

import inspect

import pytest

from nndoctor.catalog import table as catalog_table
from nndoctor.catalog.update import entry_of, registered_entries, render
from nndoctor.core.registry import (
    SCOPE_FAMILIES,
    Check,
    all_checks,
    get_check,
    register,
    registered_checks,
)

STALE = f"the catalog table is stale: run `{catalog_table.UPDATE_COMMAND}`"


def test_table_equals_the_registered_checks():
    registered = {e["code"]: e for e in registered_entries()}
    table = {r.code: r for r in catalog_table.all_rules()}
    missing = sorted(set(registered) - set(table))
    assert not missing, f"codes without a table entry: {missing}; {STALE}"
    orphans = sorted(set(table) - set(registered))
    assert not orphans, f"table entries without a check: {orphans}; {STALE}"
    for code, entry in registered.items():
        rule = table[code]
        found = {key: getattr(rule, key) for key in entry}
        found["severity"] = rule.severity.label
        assert found == entry, f"{code} differs from its check; {STALE}"


@pytest.mark.parametrize("scope", sorted(SCOPE_FAMILIES))
def test_a_scopes_families_hold_every_check_of_that_scope(scope):
    """The Keras and tf.data observers load only their scope's families (no torch import): a
    check of that scope defined anywhere else would silently never run."""
    everywhere = {c for c in all_checks() if c.scope == scope}
    assert everywhere, f"no check has scope {scope!r}"
    outside = sorted(f"{c.code} ({c.__module__})" for c in everywhere if c.__module__ not in SCOPE_FAMILIES[scope])
    assert not outside, f"{scope} checks outside registry.SCOPE_FAMILIES[{scope!r}]: {outside}"
    assert set(all_checks(scope)) == everywhere


def test_generated_file_is_exactly_what_update_writes():
    from nndoctor.catalog.update import ENTRIES_PATH

    assert ENTRIES_PATH.read_text(encoding="utf-8") == render(registered_entries()), STALE


def test_documentation_and_place_are_read_from_the_source_without_importing():
    for cls in registered_checks():
        rule = catalog_table.rule(cls.code)
        assert rule.documentation() == cls.documentation(), cls.code
        path = inspect.getsourcefile(cls)
        lines, first = inspect.getsourcelines(cls)  # from the decorator on
        line = first + next(i for i, text in enumerate(lines) if text.lstrip().startswith("class "))
        assert rule.where() == f"{path}:{line} ({cls.__qualname__})"


def test_finding_from_the_table_matches_the_checks_own():
    for cls in registered_checks():
        ours = catalog_table.rule(cls.code).finding("m", evidence={"a": 1}, fix=None)
        theirs = cls.finding("m", evidence={"a": 1})
        assert ours == theirs


def test_lookup_by_code_and_name():
    assert catalog_table.find_rule("m101").name == "eval-in-train-mode"
    assert catalog_table.find_rule("eval-in-train-mode").code == "M101"
    assert catalog_table.find_rule("Z999") is None
    with pytest.raises(KeyError, match="--update"):
        catalog_table.rule("Z999")


def test_selectors_match_codes_prefixes_names_and_all():
    m101 = catalog_table.rule("M101")
    assert catalog_table.is_enabled(m101, ["M1"], [])
    assert catalog_table.is_enabled(m101, ["ALL"], ["M102"])
    assert not catalog_table.is_enabled(m101, ["O1"], [])
    assert not catalog_table.is_enabled(m101, [], ["eval-in-train-mode"])
    assert catalog_table.unknown_selectors(["M101", "F1", "eval-in-train-mode", "ALL", "Z9", "no-such"]) == [
        "Z9", "no-such"]
    # A code outside the catalog (an internal error's finding) is never filtered out.
    assert catalog_table.code_enabled("Z999", ["M101"], [])
    assert not catalog_table.code_enabled("F101", ["M101"], [])


def test_register_rejects_a_misspelt_handler():
    class Typo(Check):
        code = "Z998"
        name = "typo"
        summary = fix = ""

        def on_fowrard(self, event):  # noqa: ANN001 - the misspelling under test
            pass

    with pytest.raises(TypeError, match="on_fowrard"):
        register(Typo)
    assert get_check("Z998") is None


def test_internal_subscribers_are_not_checks_and_have_no_code():
    from nndoctor.commands.perf.torch.inject import ChangeInjector
    from nndoctor.commands.perf.torch.recorder import PerfRecorder
    from nndoctor.commands.perf.torch.rerun_child import StepClock
    from nndoctor.commands.preflight.probe import PreflightProbe
    from nndoctor.run.history import HistoryRecorder

    for cls in (HistoryRecorder, ChangeInjector, PerfRecorder, StepClock, PreflightProbe):
        assert not issubclass(cls, Check)
        assert not hasattr(cls, "code")
        assert cls.subscriber_name


def test_a_failing_subscriber_is_named_and_disabled():
    from nndoctor.core.engine import Session
    from nndoctor.core.events import RunEnd

    class Broken:
        subscriber_name = "broken helper"
        calls = 0

        def on_run_end(self, event):  # noqa: ANN001
            Broken.calls += 1
            raise RuntimeError("boom")

    session = Session(checks=[])
    session.subscribe(Broken())
    session.emit(RunEnd(status="completed"))
    session.emit(RunEnd(status="completed"))
    assert Broken.calls == 1
    assert [e.where for e in session.report.internal_errors] == ["broken helper on run_end"]


def test_entry_of_reads_the_class_attributes():
    cls = get_check("D101")
    entry = entry_of(cls)
    assert entry["module"] == cls.__module__ and entry["class_name"] == cls.__qualname__
    assert entry["severity"] == cls.severity.label and entry["scope"] == cls.scope


def test_heuristic_checks_show_their_measured_false_positive_rate(capsys):
    from nndoctor.cli import main

    assert main(["checks", "D103"]) == 0
    heuristic = capsys.readouterr().out
    assert "## Heuristic" in heuristic and "0.0% of 2,000 decisions" in heuristic
    assert "## Source" in heuristic and "inputs.py:" in heuristic
    assert main(["checks", "D105"]) == 0
    assert "False positives: not measured yet." in capsys.readouterr().out
    assert main(["checks", "M101"]) == 0
    assert "## Heuristic" not in capsys.readouterr().out
    # A measured rate belongs to a heuristic check only.
    assert all(r.heuristic for r in catalog_table.all_rules() if r.false_positives)
