"""Reporters: render a Report for people (terminal) and programs (JSON). No torch here."""

from nndoctor.report.json_report import render_json, write_json
from nndoctor.report.terminal import print_report, render_text

__all__ = ["print_report", "render_json", "render_text", "write_json"]
