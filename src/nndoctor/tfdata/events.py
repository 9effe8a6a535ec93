"""The event the ``tf.data`` observer emits on the run's ``Session`` (see ``keras/events.py``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from nndoctor.core.events import Event, add_event_kinds

if TYPE_CHECKING:
    from nndoctor.tfdata.instrument import DatasetRecord


@dataclass(eq=False)
class DatasetIterated(Event):
    """At the end of the run, once per dataset the script iterated: what was learned about it
    (fetch times, the pipeline's stages, the labels of its first batches)."""

    kind: ClassVar[str] = "dataset_iterated"
    record: DatasetRecord | None = None


add_event_kinds(DatasetIterated)
