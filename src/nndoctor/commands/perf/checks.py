"""Performance checks P101–P110 (P108 retained-loss-graph lives with the memory checks);
importing this module registers them.

- ``run_checks``: P102 and P107, cheap enough for ``nndoctor run``, watch its events;
- ``measured_checks``: the perf-scope checks (documentation and metadata);
- ``detection``: thresholds and the pure detection functions;
- ``diagnosis``: ``diagnose(result)`` and ``advice(result)`` over a finished ``PerfResult``.
"""

from __future__ import annotations

from nndoctor.commands.perf import measured_checks, run_checks

FAMILIES = (run_checks, measured_checks)

__all__ = ["FAMILIES"]
