"""Helpers that import nothing else of nndoctor: atomic writes, size limits, sanitised
text, nndoctor's errors, the protobuf wire format, DTensor shards."""
