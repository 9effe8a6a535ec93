"""Evidence that a pipeline assumes RGB channel order (for D103 channel-order-swapped).

A colour statistic alone cannot tell BGR photographs from data whose channel order does not
matter (noise, synthetic renders, a GAN's outputs, a model trained from scratch on whatever
order it is given). The order matters when something fixed it in advance: weights trained
on RGB images loaded into the model, ImageNet's per-channel normalisation constants (they
are RGB-ordered), or images read with OpenCV (which returns BGR). These facts are gathered
here as plain strings.
"""

from __future__ import annotations

import io
import os
import re
import sys
import tokenize
from functools import lru_cache

# (pattern, what it shows). Searched in the user's own source files.
_SOURCE_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"\bcv2\.(imread|imdecode|VideoCapture)\b"), "images are read with OpenCV (BGR order)"),
    (re.compile(r"0\.485\b|0\.406\b|\bIMAGENET_(DEFAULT_)?(MEAN|STD)\b|\bimagenet_(mean|std)\b", re.IGNORECASE),
     "ImageNet's RGB normalisation constants are used"),
    (re.compile(r"\bpretrained\s*=\s*True\b|\bweights\s*=\s*['\"]?(DEFAULT|IMAGENET)|_Weights\.|\btorch\.hub\.load\b"
                r"|\bfrom_pretrained\b"), "pretrained weights are requested"),
)
_MAX_FILES = 200
_MAX_BYTES = 2_000_000


@lru_cache(maxsize=512)
def _file_evidence(path: str, mtime: float) -> tuple[str, ...]:
    try:
        if os.path.getsize(path) > _MAX_BYTES:
            return ()
        with open(path, encoding="utf-8", errors="replace") as handle:
            text = code_only(handle.read())
    except OSError:
        return ()
    return tuple(what for pattern, what in _SOURCE_PATTERNS if pattern.search(text))


def code_only(source: str) -> str:
    """The source without comments and docstrings (a comment that mentions ``cv2.imread`` is
    no evidence); string arguments such as ``weights="DEFAULT"`` stay."""
    out: list[str] = []
    previous = tokenize.NEWLINE
    try:
        for token in tokenize.generate_tokens(io.StringIO(source).readline):
            kind = token.type
            if kind in (tokenize.COMMENT, tokenize.NL):
                continue
            if kind == tokenize.STRING and previous in (tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT):
                previous = kind
                continue  # a docstring or a bare string statement
            out.append(token.string if kind != tokenize.NEWLINE else "\n")
            previous = kind
    except (tokenize.TokenError, SyntaxError, IndentationError):
        return source
    return " ".join(out).replace(" . ", ".").replace(" (", "(")


def source_evidence(user_file: str | None) -> list[str]:
    """RGB evidence in the user's code: the file that called the model and every module
    imported from its directory (a dataset module that calls ``cv2.imread``)."""
    if not user_file or not os.path.isfile(user_file):
        return []
    folder = os.path.dirname(os.path.abspath(user_file)) + os.sep
    files = [os.path.abspath(user_file)]
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if isinstance(path, str) and path.endswith(".py") and os.path.abspath(path).startswith(folder):
            files.append(os.path.abspath(path))
        if len(files) >= _MAX_FILES:
            break
    found: list[str] = []
    for path in dict.fromkeys(files):
        try:
            mtime = os.path.getmtime(path)
        except OSError:
            continue
        for what in _file_evidence(path, mtime):
            note = f"{what} ({os.path.basename(path)})"
            if what not in " ".join(found):
                found.append(note)
    return found


def takes_rgb_images(module) -> bool:
    """Does the model contain a 2-D convolution over 3 input channels?"""
    import torch.nn as nn

    return any(isinstance(m, nn.Conv2d) and m.in_channels == 3 for m in module.modules())
