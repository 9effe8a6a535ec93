"""nndoctor inside other tools: ``watch()`` (``api``), Lightning and 🤗 callbacks, the
pytest plugin, notebooks (``base`` holds what the callbacks share).

``nndoctor.integrations.lightning``, ``nndoctor.integrations.transformers`` and ``nndoctor.integrations.pytest_plugin``
stay importable: ``nndoctor/__init__`` serves them from here."""
