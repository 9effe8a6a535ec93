"""Installed packages whose declared requirements are not met (what ``pip check`` reports),
and distributions installed more than once on ``sys.path``.

Read from ``importlib.metadata`` (the ``Requires-Dist`` lines every wheel carries), so it
needs no pip and imports none of the packages.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from importlib import metadata

from packaging.markers import default_environment
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version


@dataclass(frozen=True)
class UnmetRequirement:
    package: str  # the installed distribution that declares the requirement
    package_version: str
    requirement: str  # "torch==2.5.1"
    installed: str | None  # the version present, or None when missing

    def describe(self) -> str:
        have = f"{self.installed} is installed" if self.installed else "it is not installed"
        return f"{self.package} {self.package_version} requires {self.requirement}, but {have}"


@dataclass(frozen=True)
class DuplicateInstall:
    name: str
    locations: tuple[tuple[str, str], ...]  # (version, folder) in sys.path order


def _installed() -> dict[str, list[metadata.Distribution]]:
    found: dict[str, list[metadata.Distribution]] = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            found.setdefault(canonicalize_name(name), []).append(dist)
    return found


def _requirement_holds(requirement: Requirement, installed: str | None) -> bool:
    if installed is None:
        return False
    if not requirement.specifier:
        return True
    try:
        return requirement.specifier.contains(Version(installed), prereleases=True)
    except InvalidVersion:
        return True  # a version we cannot parse: do not guess


def unmet_requirements(distributions: dict[str, list[metadata.Distribution]] | None = None) -> list[UnmetRequirement]:
    """Every requirement (without extras) of every installed distribution that is not met."""
    distributions = distributions if distributions is not None else _installed()
    versions = {name: dists[0].version for name, dists in distributions.items()}
    environment = {key: str(value) for key, value in default_environment().items()}
    unmet = []
    for _name, dists in sorted(distributions.items()):
        dist = dists[0]  # the one Python imports (first on sys.path)
        for line in dist.requires or ():
            try:
                requirement = Requirement(line)
            except InvalidRequirement:
                continue
            # Optional extras are not installed by default, so they are not requirements.
            if requirement.marker is not None and not requirement.marker.evaluate({**environment, "extra": ""}):
                continue
            have = versions.get(canonicalize_name(requirement.name))
            if not _requirement_holds(requirement, have):
                spec = f"{requirement.name}{requirement.specifier}"
                unmet.append(UnmetRequirement(dist.metadata["Name"], dist.version, spec, have))
    return unmet


def duplicate_installs(distributions: dict[str, list[metadata.Distribution]] | None = None) -> list[DuplicateInstall]:
    """Distributions found in more than one folder of ``sys.path``: which one imports depends on order."""
    distributions = distributions if distributions is not None else _installed()
    duplicates = []
    for _name, dists in sorted(distributions.items()):
        places = []
        for dist in dists:
            folder = os.path.dirname(str(getattr(dist, "_path", "") or ""))
            if (dist.version, folder) not in places:
                places.append((dist.version, folder))
        if len({folder for _, folder in places}) > 1:
            duplicates.append(DuplicateInstall(dists[0].metadata["Name"], tuple(places)))
    return duplicates


def installed_distributions() -> dict[str, list[metadata.Distribution]]:
    return _installed()
