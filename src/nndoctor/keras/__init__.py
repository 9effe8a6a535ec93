"""Keras 3 support: the same doctor for ``model.fit`` / ``model.evaluate`` and custom loops.

``instrument`` (and ``tf_loops`` on TensorFlow) patches Keras only when the user's script
imports it and emits the events of ``events`` on the run's session; ``facts`` turns one observed
batch into plain numbers; ``checks`` and ``loop_checks`` hold the K checks, ``data_variants`` and
``training_variants`` the Keras classes of codes PyTorch owns (importing them never imports Keras).
"""
