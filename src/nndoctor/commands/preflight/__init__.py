"""Preflight: active tests on copies of the user's model at the first optimizer step
(``nndoctor preflight SCRIPT`` stops there; ``nndoctor run --preflight`` trains on unchanged)."""
