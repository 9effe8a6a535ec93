"""Notebooks: ``watch()`` shows one HTML block, with locations as "cell N, line M".

In a Jupyter kernel a cell's code runs from a temporary file (``/tmp/ipykernel_…/….py``);
IPython's compiler keeps the map from those names to the cell's execution count (the N of
``In [N]``), which is what the report shows instead. The block is the HTML report in an
``<iframe srcdoc>``, so its styles and script cannot touch the notebook's page; its header
names the notebook (``JPY_SESSION_NAME`` from Jupyter Server, ``__vsc_ipynb_file__`` in VS
Code).
"""

from __future__ import annotations

import html
import os
from collections.abc import Callable
from typing import Any

from nndoctor.core.findings import Location, Report


def notebook_shell() -> Any | None:
    """The running Jupyter kernel's shell, or None (a terminal IPython is not a notebook)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    shell = get_ipython()
    if shell is None:
        return None
    if type(shell).__name__ == "ZMQInteractiveShell" or getattr(shell, "kernel", None) is not None:
        return shell
    return None


def notebook_name(shell: Any) -> str | None:
    session = os.environ.get("JPY_SESSION_NAME")
    if session:
        return os.path.basename(session)
    vscode = getattr(shell, "user_ns", {}).get("__vsc_ipynb_file__")
    return os.path.basename(vscode) if vscode else None


def cell_locator(shell: Any) -> Callable[[Location], str]:
    """Location -> "cell N, line M" for code from a cell, else the path as usual."""
    filename_map = dict(getattr(getattr(shell, "compile", None), "_filename_map", {}) or {})

    def display(location: Location) -> str:
        cell = filename_map.get(location.path)
        if cell is None:
            cell = filename_map.get(os.path.abspath(location.path))
        if cell is None:
            return str(location)
        return f"cell {cell}, line {location.line}" if location.line is not None else f"cell {cell}"

    return display


_RESIZE = ("<script>(function(){var f=window.frameElement;if(!f)return;function fit(){"
           "f.style.height=(document.documentElement.scrollHeight+4)+'px';}"
           "window.addEventListener('load',fit);setTimeout(fit,50);})();</script>")


def report_block(report: Report, shell: Any) -> str:
    """The report as one HTML block for the notebook's output area."""
    from nndoctor.report.html import render_html

    page = render_html(report, title=notebook_name(shell) or "notebook", display_location=cell_locator(shell))
    page = page.replace("</body>", _RESIZE + "</body>", 1)
    return (f'<iframe srcdoc="{html.escape(page, quote=True)}" title="nndoctor report" '
            'style="width:100%;height:900px;border:0" loading="eager"></iframe>')


def display_report(report: Report, shell: Any) -> None:
    from IPython.display import HTML, display

    display(HTML(report_block(report, shell)))
