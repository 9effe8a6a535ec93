"""--select / --ignore for ``nndoctor data``, resolved against the data checks only.

The shared ``nndoctor.selection`` loads every check family, and the runtime families import
torch (~4 s and ~1 GiB of RSS before the first file is read, then inherited by every forked
worker). The data command only needs its own sixteen checks, so it matches selectors here.
"""

from __future__ import annotations

import argparse
import re

from nndoctor.data.checks import DATA_CHECKS
from nndoctor.errors import UsageError
from nndoctor.findings import Report
from nndoctor.registry import Check, is_enabled, parse_codes

# A code or a code prefix of any family (M1, O101 …): valid in shared CI configs even though
# no data check matches it, so it is accepted and simply selects nothing here.
_CODE_LIKE = re.compile(r"^[A-Za-z][0-9]{0,3}$")


def data_selectors(args: argparse.Namespace) -> tuple[list[str], list[str]]:
    select = parse_codes(getattr(args, "select", None) or [])
    ignore = parse_codes(getattr(args, "ignore", None) or [])
    known = {c.name for c in DATA_CHECKS}
    bad = [s for s in select + ignore if s.upper() != "ALL" and not _CODE_LIKE.match(s) and s.lower() not in known]
    if bad:
        raise UsageError(f"unknown check code or name: {', '.join(bad)} (see 'nndoctor checks --scope data')")
    return select, ignore


def check_enabled(check: type[Check], select: list[str], ignore: list[str]) -> bool:
    return is_enabled(check, select, ignore)


def filter_data_findings(report: Report, select: list[str], ignore: list[str]) -> None:
    by_code = {c.code: c for c in DATA_CHECKS}
    report.findings = [
        f for f in report.findings if f.code not in by_code or is_enabled(by_code[f.code], select, ignore)
    ]
