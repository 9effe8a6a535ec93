"""Import order guard: with TensorFlow 2.21 and triton in one process, importing triton *after*
TensorFlow crashes the interpreter (segmentation fault in triton/knobs.py), while the other
order works. Keras on the torch backend imports torch._dynamo, hence triton; so this worker
imports it before these tests bring TensorFlow in."""

import contextlib

with contextlib.suppress(ImportError):
    import torch._dynamo  # noqa: F401
