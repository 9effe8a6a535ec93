"""``nndoctor perf`` on PyTorch: the recorder and its instrumentation, the ``--try`` re-runs and
trials, the kernel timeline, DDP, and the diagnosis of a PyTorch window (``backend.py``).

Nothing here is imported by the framework-neutral perf modules at module level, and nothing here
imports ``perf/tf``.
"""
