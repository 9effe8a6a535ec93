"""The probes a check can ask for: instrumentation installed only when an enabled check (or a
subscriber, like the perf recorder) needs it.

A check lists the probes it reads in ``needs`` (``needs = frozenset({"construction_sites"})``);
the events it reads it declares by its ``on_<kind>`` methods. At install time the
instrumentation installs the cheap core hooks (module and optimizer hooks, the patches that
emit events, step counting, crash context) for every run, each probe below only when an
enabled check needs it, and the patches that produce an event kind only when some check or
listener subscribes to that kind. ``instrument/extensions.py`` maps each name to its installer.

Importing this module imports no framework (the registry validates ``needs`` against it).
"""

from __future__ import annotations

PROBES: dict[str, str] = {
    "target_ranges": "class targets of cross_entropy / nll_loss, read before the loss runs",
    "nonfinite_tracer": "forward hooks armed after a non-finite loss, to find the first non-finite module",
    "construction_sites": "the user's line that built each BatchNorm, Conv, Linear layer and optimizer",
    "seed_calls": "calls of torch, random and numpy seeding functions",
    "dropout_calls": "functional dropout called without training= inside an eval-mode module",
    "gc_clock": "time spent in Python's garbage collector",
    "compile_log": "torch.compile's recompile-limit warnings",
    "tensorboard_writers": "add_*, flush and close calls of each torch.utils.tensorboard SummaryWriter",
    "stall_watchdog": "a thread that notices a run that stopped making progress",
    # Needed by the perf recorder (an internal subscriber of ``nndoctor perf``), not by a check.
    "perf_timers": "the start of each top-level forward, CUDA synchronisations and host-device copies",
}
