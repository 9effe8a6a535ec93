"""Crash explanations (E codes): why the training script raised, in the user's terms.

``runtime.explain_crash`` explains a live crash at the end of ``nndoctor run`` / ``watch()``;
``cli`` is ``nndoctor explain`` for saved tracebacks and logs. Both read a ``crash.Crash``
and try the explanations registered by ``checks``.
"""
