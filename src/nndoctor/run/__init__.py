"""``nndoctor run``'s machinery: the runner and its CLI, guards, signals, captured streams,
the watchdog, crash context, history, the per-rank runs under ``torchrun``
(``distributed``) and the start-up step of ``python -m nndoctor``."""
