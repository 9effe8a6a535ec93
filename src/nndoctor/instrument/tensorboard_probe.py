"""``torch.utils.tensorboard.SummaryWriter`` use, per writer (R103): where it was built, how many
``add_*`` calls it received, and how many of them came after its last ``flush()``/``close()``;
its log directory, the event files already there when it was created, and the range of
``global_step`` it logged per tag.

Importing TensorBoard imports TensorFlow (seconds), so nothing here imports it: the methods are
wrapped once the user's script imports ``torch.utils.tensorboard`` (``when_imported``). The
records hold no reference to the writer (a ``WeakKeyDictionary`` maps a live writer to its
record), so a writer the user drops is freed as before.
"""

from __future__ import annotations

import functools
import inspect
import numbers
import os
import sys
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from nndoctor.core.findings import Location
from nndoctor.core.stash import StashKey
from nndoctor.core.user_code import user_location
from nndoctor.tfdata.hooks import when_imported

if TYPE_CHECKING:
    from nndoctor.instrument.installation import InstallationProtocol

WRITER_MODULE = "torch.utils.tensorboard.writer"


@dataclass
class WriterRecord:
    created_at: Location | None
    adds: int = 0  # outermost add_* calls (add_images calling add_image counts once)
    adds_since_flush: int = 0
    flushes: int = 0
    closes: int = 0
    depth: int = 0  # add_* calls in progress on this writer (nested ones are not counted)
    log_dir: str | None = None
    # event files already in log_dir when the writer was created (an earlier run's)
    earlier_files: list[str] = field(default_factory=list)
    own_files: list[str] = field(default_factory=list)  # the event file(s) this writer created
    purge_step: int | None = None
    # tag -> (first, last) global_step logged by add_* calls that write to log_dir itself
    steps: dict[str, tuple[int, int]] = field(default_factory=dict)

    def logged(self, tag: str, step: int) -> None:
        first, last = self.steps.get(tag, (step, step))
        self.steps[tag] = (min(first, step), max(last, step))


EVENT_FILE_MARK = "tfevents"


def event_files(log_dir: str) -> list[str]:
    """The TensorBoard event files directly in ``log_dir`` (none when it does not exist)."""
    try:
        return sorted(os.path.join(log_dir, n) for n in os.listdir(log_dir) if EVENT_FILE_MARK in n)
    except OSError:
        return []


class WriterLog:
    def __init__(self) -> None:
        self.records: list[WriterRecord] = []
        self._by_writer: weakref.WeakKeyDictionary[Any, WriterRecord] = weakref.WeakKeyDictionary()

    def created(self, writer: Any, where: Location | None) -> None:
        record = WriterRecord(where)
        self.records.append(record)
        try:
            self._by_writer[writer] = record
        except TypeError:  # a subclass with __slots__ and no __weakref__: not followed
            self.records.pop()

    def of(self, writer: Any) -> WriterRecord | None:
        try:
            return self._by_writer.get(writer)
        except TypeError:
            return None


WRITER_LOG = StashKey[WriterLog]("tensorboard writers")


def writer_log(session: Any) -> WriterLog | None:
    """The session's writer records (None when the probe is not installed)."""
    return session.stash.get(WRITER_LOG, None)


def patch_writer_class(cls: type, log: WriterLog, session: Any, patcher: Any) -> None:
    """Wrap ``cls.__init__``, every ``add_*`` method, ``flush`` and ``close`` to keep ``log``."""
    original_init = cls.__init__  # type: ignore[misc]  # whichever __init__ the class has, wrapped

    @functools.wraps(original_init)
    def __init__(self, *args, **kwargs):
        outermost = session.active and log.of(self) is None
        asked_dir = args[0] if args else kwargs.get("log_dir")
        earlier = event_files(str(asked_dir)) if outermost and isinstance(asked_dir, (str, os.PathLike)) else []
        original_init(self, *args, **kwargs)
        if outermost and log.of(self) is None:  # a subclass's __init__ calling ours: once
            log.created(self, user_location(sys._getframe(1)))
            record = log.of(self)
            if record is not None:
                log_dir = getattr(self, "log_dir", None)
                record.log_dir = str(log_dir) if isinstance(log_dir, (str, os.PathLike)) else None
                record.earlier_files = earlier
                if record.log_dir is not None:
                    record.own_files = [f for f in event_files(record.log_dir) if f not in earlier]
                purge = _argument(args, kwargs, 2, "purge_step")  # SummaryWriter(log_dir, comment, purge_step)
                record.purge_step = int(purge) if isinstance(purge, numbers.Integral) else None

    patcher.patch(cls, "__init__", __init__)
    for name in [n for n in vars(cls) if n.startswith("add_") and callable(vars(cls)[n])]:
        _wrap_add(cls, name, log, patcher)
    _wrap_flush(cls, "flush", log, patcher, closing=False)
    _wrap_flush(cls, "close", log, patcher, closing=True)


def _tag_and_step_positions(method: Any) -> tuple[int, int] | None:
    """Argument positions (after self) of ``tag`` and ``global_step``, for the add_* methods
    that write into the writer's own event file (add_scalars writes to sub-directories)."""
    try:
        names = list(inspect.signature(method).parameters)[1:]
    except (TypeError, ValueError):
        return None
    if "tag" not in names or "global_step" not in names:
        return None
    return names.index("tag"), names.index("global_step")


def _argument(args: tuple, kwargs: dict, position: int, name: str) -> Any:
    return args[position] if len(args) > position else kwargs.get(name)


def _wrap_add(cls: type, name: str, log: WriterLog, patcher: Any) -> None:
    original = getattr(cls, name)
    positions = _tag_and_step_positions(original)

    @functools.wraps(original)
    def add(self, *args, **kwargs):
        record = log.of(self)
        if record is None:
            return original(self, *args, **kwargs)
        record.depth += 1
        try:
            return original(self, *args, **kwargs)
        finally:
            record.depth -= 1
            if record.depth == 0:
                record.adds += 1
                record.adds_since_flush += 1
                if positions is not None:
                    tag = _argument(args, kwargs, positions[0], "tag")
                    step = _argument(args, kwargs, positions[1], "global_step")
                    # plain ints only: reading a tensor step could synchronise a device
                    if isinstance(tag, str) and isinstance(step, numbers.Integral) and not isinstance(step, bool):
                        record.logged(tag, int(step))

    patcher.patch(cls, name, add)


def _wrap_flush(cls: type, name: str, log: WriterLog, patcher: Any, *, closing: bool) -> None:
    original = getattr(cls, name)

    @functools.wraps(original)
    def flush(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        record = log.of(self)
        if record is not None:  # counted after it returned: a flush that raised wrote nothing
            record.adds_since_flush = 0
            if closing:
                record.closes += 1
            else:
                record.flushes += 1
        return result

    patcher.patch(cls, name, flush)


def install(installation: InstallationProtocol) -> None:
    session = installation.session
    log = session.stash[WRITER_LOG] = WriterLog()

    def patch(module: Any) -> None:
        cls = getattr(module, "SummaryWriter", None)
        if not isinstance(cls, type):
            return
        try:
            patch_writer_class(cls, log, session, installation.patcher)
        except Exception as error:  # noqa: BLE001 - observer rule: the run goes on unobserved
            session.internal_error("tensorboard writer instrumentation", error)

    when_imported(WRITER_MODULE, patch, installation.patcher)
