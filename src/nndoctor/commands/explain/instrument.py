"""Crash-path instrumentation for explanations: which dataset indices the failing batch held.

``_MapDatasetFetcher.fetch`` receives the indices of the batch it builds. Wrapped in a bare
``try/except`` (no cost unless it raises), it attaches those indices to the exception as a
note. Notes are part of the formatted traceback, so they survive the trip from a DataLoader
worker process to the main process inside the ``ExceptionWrapper`` message. With them the
explanation can re-fetch the items one by one and name the samples that broke the batch.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nndoctor.instrument.installation import InstallationProtocol

NOTE_PREFIX = "nndoctor: the failing batch holds dataset indices "
ATTRIBUTE = "__nndoctor_batch_indices__"
_MAX_INDICES = 512


def batch_note(indices: Any) -> str:
    """The note text for a batch's indices (a list, or one index without auto-collation)."""
    if isinstance(indices, (list, tuple)):
        shown = [int(i) if isinstance(i, int) else i for i in list(indices)[:_MAX_INDICES]]
        more = f" … (+{len(indices) - _MAX_INDICES})" if len(indices) > _MAX_INDICES else ""
        return f"{NOTE_PREFIX}{shown}{more}"
    return f"{NOTE_PREFIX}[{indices!r}]"


def attach_indices(error: BaseException, indices: Any) -> None:
    """Record the batch's indices on ``error`` once (nested fetches must not repeat it)."""
    if getattr(error, ATTRIBUTE, None) is not None:
        return
    try:
        setattr(error, ATTRIBUTE, list(indices) if isinstance(indices, (list, tuple)) else [indices])
        if hasattr(error, "add_note"):
            error.add_note(batch_note(indices))
        else:  # Python 3.10: kept for this process only (tracebacks print notes from 3.11 on)
            error.__notes__ = [*getattr(error, "__notes__", []), batch_note(indices)]  # type: ignore[attr-defined]  # 3.11+ in the stubs
    except Exception:  # noqa: BLE001 - an exception type that refuses attributes keeps its message
        pass


def install(installation: InstallationProtocol) -> None:
    """Wrap the map-style fetcher; undone by ``installation.uninstall()``."""
    from torch.utils.data._utils import fetch as fetch_module

    fetcher = fetch_module._MapDatasetFetcher
    original = fetcher.fetch

    @functools.wraps(original)
    def fetch(self, possibly_batched_index):
        try:
            return original(self, possibly_batched_index)
        except StopIteration:
            raise
        except Exception as error:
            attach_indices(error, possibly_batched_index)
            raise

    installation.patcher.patch(fetcher, "fetch", fetch)
