"""Readers of record formats: each cuts a source into units (``plan``) and reads one (``read``)."""
