"""``nndoctor perf`` on Keras/TensorFlow: the step clock (input wait vs compute), the ``--try``
re-runs, and the diagnosis of a TensorFlow window (``backend.py``).

Nothing here imports torch or ``perf/torch``, and the framework-neutral perf modules import
nothing from here at module level.
"""
