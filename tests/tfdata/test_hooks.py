"""The one post-import hook (``tfdata.hooks.when_imported``) that Keras, tf.data, TensorBoard and the
TensorFlow perf clock share: stacked hooks on one package all run, in one import, and leave the
package with its own loader."""

from __future__ import annotations

import importlib
import sys

from nndoctor.tfdata.hooks import when_imported


class _Patcher:
    def __init__(self) -> None:
        self.undo: list = []

    def on_undo(self, action) -> None:
        self.undo.append(action)


def test_stacked_hooks_all_run_once_and_leave_the_package_loader(tmp_path, monkeypatch):
    (tmp_path / "nndoctor_hooked_pkg.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    finders = list(sys.meta_path)
    seen: list[tuple[str, int]] = []
    patcher = _Patcher()
    try:
        when_imported("nndoctor_hooked_pkg", lambda m: seen.append(("keras-like", m.VALUE)), patcher)
        when_imported("nndoctor_hooked_pkg", lambda m: seen.append(("tfdata-like", m.VALUE)), patcher)
        module = importlib.import_module("nndoctor_hooked_pkg")
        assert sorted(seen) == [("keras-like", 1), ("tfdata-like", 1)]
        assert list(sys.meta_path) == finders  # each hook removed itself after the import
        loader = module.__spec__.loader
        assert module.__loader__ is loader and type(loader).__name__ == "SourceFileLoader"
        importlib.reload(module)  # a reload uses the package's own loader, and runs no hook again
        assert len(seen) == 2
        when_imported("nndoctor_hooked_pkg", lambda m: seen.append(("late", m.VALUE)), patcher)
        assert seen[-1] == ("late", 1)  # already imported: run at once, no hook installed
        assert list(sys.meta_path) == finders
    finally:
        for action in patcher.undo:
            action()
        sys.modules.pop("nndoctor_hooked_pkg", None)
