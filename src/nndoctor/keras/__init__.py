"""Keras 3 support: the same doctor for ``model.fit`` / ``model.evaluate`` (K checks).

``instrument`` patches Keras only when the user's script imports it; ``facts`` turns one
observed batch into plain numbers; ``checks`` holds the K checks (importing it never
imports Keras).
"""
