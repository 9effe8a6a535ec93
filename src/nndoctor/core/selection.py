"""Turning the shared CLI options into a check selection and a failure threshold.

Selectors are checked against the static catalog table, so every command accepts every code
of the catalog (a shared CI configuration may name M101 and still serve ``nndoctor data``)
without importing any check family or framework.
"""

from __future__ import annotations

import argparse

from nndoctor.catalog.table import code_enabled, unknown_selectors
from nndoctor.core.findings import Report, Severity
from nndoctor.core.registry import (
    parse_codes as parse_codes,  # re-exported (api.py imports it here)
)
from nndoctor.util.errors import UsageError


def selectors(args: argparse.Namespace) -> tuple[list[str], list[str]]:
    select = parse_codes(getattr(args, "select", None) or [])
    ignore = parse_codes(getattr(args, "ignore", None) or [])
    bad = unknown_selectors(select + ignore)
    if bad:
        raise UsageError(f"unknown check code or name: {', '.join(bad)} (see 'nndoctor checks')")
    return select, ignore


def fail_threshold(args: argparse.Namespace) -> Severity | None:
    value = getattr(args, "fail_on", "error")
    return None if value == "never" else Severity.parse(value)


def filter_findings(report: Report, select: list[str], ignore: list[str]) -> None:
    """Drop findings the user did not ask for (for subcommands that build findings directly)."""
    report.findings = [f for f in report.findings if code_enabled(f.code, select, ignore)]
