"""A feature of the instrumentation and when it is installed (``instrument/extensions.py`` lists them).

Every feature says when it is installed:

- ``needed=True``: only when an enabled check, or a subscriber such as the perf recorder,
  lists the feature's name in its ``needs`` (the names are the probes of ``nndoctor.core.probes``;
  the Keras and tf.data probes, ``KERAS_PROBES``, are installed by their observers once the
  script imports the framework and the observer has added its checks: ``keras/probes.py``);
- ``events=(...)``: only when some check or listener subscribes to one of those event kinds
  (the patch exists to emit them);
- neither: for every run (cheap hooks that keep the run's own bookkeeping: steps, Keras steps
  and ``--max-steps``, crash context, warnings, distributed children).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class Feature:
    name: str  # recorded in ``installation.probes`` when installed
    # Patches through installation.patcher (undone at uninstall). Given an InstallationProtocol;
    # the torch features (installed only with PyTorch's hooks) take torch_hooks.Installation.
    install: Callable[[Any], None]
    needed: bool = False
    events: tuple[str, ...] = ()

    def wanted(self, session: Any, needed: frozenset[str]) -> bool:
        if self.needed:
            return self.name in needed
        if self.events:
            return any(session.wants(kind) for kind in self.events)
        return True


class FeatureHost(Protocol):
    """What ``install_features`` is given: a run's installation (``InstallationProtocol``), or
    the Keras observer, which installs its probes once the script imports Keras (its ``probes``
    is the installation's list)."""

    session: Any
    probes: list[str]


def install_features(installation: FeatureHost, features: Iterable[Feature]) -> None:
    """Install every feature the session asks for, recording its name in ``installation.probes``."""
    session = installation.session
    needed = session.needed_probes()
    for feature in features:
        if not feature.wanted(session, needed):
            continue
        feature.install(installation)
        if feature.name not in installation.probes:  # one probe may have several installers
            installation.probes.append(feature.name)
