"""Instrumentation: torch hooks and thin reversible patches that turn training activity into events.

This layer knows nothing of checks. ``nndoctor.instrument.extensions.install(session)``
instruments a run and returns an ``Installation`` whose ``uninstall()`` restores every
patched attribute and removes every hook. Nothing is imported here: importing one module of
this package (``instrument.patches``) does not load the hook layer and every feature, and
without PyTorch only the torch-free features (Keras, tf.data) are installed.
"""
