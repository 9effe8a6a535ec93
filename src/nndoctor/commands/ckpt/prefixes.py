"""Wrapper prefixes: ``module.`` (DataParallel / DistributedDataParallel) and ``_orig_mod.``
(torch.compile) that end up in saved keys when the wrapper, not the model, is saved."""

from __future__ import annotations

from collections.abc import Iterable

WRAPPER_SEGMENTS = ("module", "_orig_mod")
WRAPPER_ORIGIN = {"module": "DataParallel/DistributedDataParallel", "_orig_mod": "torch.compile"}


def leading_wrapper_prefix(keys: Iterable[str]) -> str:
    """The chain of wrapper prefixes every key starts with (``"module._orig_mod."``), or ""."""
    keys = list(keys)
    prefix = ""
    while keys:
        for segment in WRAPPER_SEGMENTS:
            token = segment + "."
            if all(k.startswith(prefix + token) for k in keys):
                prefix += token
                break
        else:
            break
    return prefix


def keys_with_infix_compile_wrapper(keys: Iterable[str]) -> list[str]:
    """Keys where a compiled submodule left ``._orig_mod.`` in the middle of the name."""
    return [k for k in keys if "._orig_mod." in k]


def partial_wrapper_keys(keys: Iterable[str]) -> list[str]:
    """Keys that start with a wrapper prefix when not all keys do (a mixed, broken file)."""
    keys = list(keys)
    if leading_wrapper_prefix(keys):
        return []
    return [k for k in keys if any(k.startswith(s + ".") for s in WRAPPER_SEGMENTS)]


def wrappers_named(prefix: str) -> list[str]:
    return [WRAPPER_ORIGIN[s] for s in prefix.rstrip(".").split(".") if s in WRAPPER_ORIGIN]


def strip_wrappers(key: str, leading: str) -> str:
    """Remove the leading wrapper chain and any infix ``_orig_mod.`` from one key."""
    if leading and key.startswith(leading):
        key = key[len(leading):]
    return key.replace("._orig_mod.", ".")
