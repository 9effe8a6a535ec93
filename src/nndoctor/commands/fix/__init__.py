"""``nndoctor fix``: turn findings into minimal source edits, apply them, prove them by re-running.

The doctor runs the script (like ``nndoctor run``); each finding whose code has a codemod
(``nndoctor.commands.fix.codemods``) becomes an :class:`~nndoctor.commands.fix.edit.Edit` of the user's file,
made with libcst so comments and formatting stay; an edit the codemod is not sure of becomes a
suggestion with the reason. ``--write`` applies the edits atomically with a backup, and
``--verify`` re-runs the patched script and keeps only the edits that removed their finding
without bringing a new one.
"""

from __future__ import annotations
