"""Findings never point into nndoctor's own entry points: the console-script launcher
(``bin/nndoctor``) that started the run is not the user's code, in a virtual environment too."""

from __future__ import annotations

import os
import sys

from nndoctor.core.user_code import INTERNAL, USER, is_tool_file, is_user_path, rank_filename


def test_the_launcher_frame_is_skipped_for_the_users_frame_above(tmp_path):
    launcher = tmp_path / "somewhere" / "bin" / "nndoctor"   # pipx, --user, a wrapper folder
    code = compile("from nndoctor.core.user_code import user_location\nfound = user_location()\n", str(launcher), "exec")
    namespace: dict = {}
    exec(code, namespace)
    found = namespace["found"]
    assert found is not None and found.path.endswith("test_user_code_launchers.py")


def test_launchers_beside_the_interpreter_as_spelt_are_internal():
    # In a virtual environment sys.executable is <venv>/bin/python, a symlink to the base
    # interpreter: the environment's own bin/ holds the launchers, whatever the symlink resolves to.
    beside = os.path.join(os.path.dirname(os.path.abspath(sys.executable)), "some-console-script")
    assert rank_filename(beside) == INTERNAL
    assert rank_filename("/home/me/.venv/bin/nndoctor") == INTERNAL
    assert rank_filename("/home/me/project/train.py") == USER


def test_launchers_are_tool_frames_and_not_user_paths_in_tracebacks():
    assert is_tool_file("/home/me/.venv/bin/nndoctor")
    assert not is_user_path("/home/me/.venv/bin/nndoctor")
    assert not is_user_path(r"C:\Users\me\venv\Scripts\nndoctor-script.py")
    assert is_user_path("/home/me/project/train.py")
