"""Keeping long lists short on the terminal: "[3, 17, 42, … and 509 more]".

A crash note can hold a whole batch's dataset indices and an evidence value a list of every
odd sample; printed whole, one finding fills the screen. Everything the terminal shows
(messages, evidence, the traceback) goes through here; the JSON report keeps every item.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

LIST_ITEMS_SHOWN = 8
# A bracketed, comma-separated list of short items on one line: "[1, 2, 3, ...]".
_ITEM = r"[^\[\],\n]{1,60}"
_LONG_LIST = re.compile(r"\[(?P<items>(?:" + _ITEM + r",){" + str(LIST_ITEMS_SHOWN) + r",}" + _ITEM + r")\]")


def more_text(hidden: int) -> str:
    return f"… and {hidden} more"


def cap_items(items: Iterable[str], limit: int = LIST_ITEMS_SHOWN) -> list[str]:
    """The first ``limit`` items, plus "… and N more" standing for the rest."""
    items = list(items)
    if len(items) <= limit:
        return items
    return items[:limit] + [more_text(len(items) - limit)]


def cap_lists(text: str, limit: int = LIST_ITEMS_SHOWN) -> str:
    """``text`` with every bracketed list longer than ``limit`` items shortened."""
    def shorten(match: re.Match[str]) -> str:
        items = [item.strip() for item in match.group("items").split(",")]
        return "[" + ", ".join(cap_items(items, limit)) + "]"

    return _LONG_LIST.sub(shorten, text)
