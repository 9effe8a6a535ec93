"""The catalog of codes: the table as data (``table``, the generated ``entries``), and the
``nndoctor checks`` command (``cli``) and its generator (``update``)."""
