"""Wording shared by the finding builders: counts with plurals, the first few items of a list."""

from __future__ import annotations

SHOWN_IN_MESSAGE = 3  # items named in a message; every item is in the finding's evidence


def listing(items: list[str], total: int | None = None) -> str:
    total = len(items) if total is None else total
    shown = ", ".join(items[:SHOWN_IN_MESSAGE])
    return shown + (f" and {total - SHOWN_IN_MESSAGE} more" if total > SHOWN_IN_MESSAGE else "")


def plural(n: int, word: str, many: str | None = None) -> str:
    return f"{n:,} {word if n == 1 else (many or word + 's')}"
