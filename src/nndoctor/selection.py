"""Turning the shared CLI options into a check selection and a failure threshold."""

from __future__ import annotations

import argparse

from nndoctor.errors import UsageError
from nndoctor.findings import Severity
from nndoctor.registry import parse_codes, unknown_selectors


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


def filter_findings(report, select: list[str], ignore: list[str]) -> None:
    """Drop findings the user did not ask for (for subcommands that build findings directly)."""
    from nndoctor.registry import get_check, is_enabled

    kept = []
    for finding in report.findings:
        cls = get_check(finding.code)
        if cls is None or is_enabled(cls, select, ignore):
            kept.append(finding)
    report.findings = kept
