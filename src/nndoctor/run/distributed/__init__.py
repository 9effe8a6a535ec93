"""Distributed runs: which rank this is, per-rank report parts, and merging them into one report.

``torchrun ... -m nndoctor run train.py`` instruments every rank; each rank writes its part
(its report plus the plain numbers the cross-rank checks compare) and rank 0 merges them.
Processes a script starts itself (``torch.multiprocessing.spawn``, ``multiprocessing.Process``)
are instrumented the same way and report back to the parent.
"""
