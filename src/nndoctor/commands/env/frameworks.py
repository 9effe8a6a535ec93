"""Which deep-learning frameworks are installed, how they were built, and what they can see.

Each framework is imported in its own child process (``probe_script.py``), all at once, so a
framework that crashes, hangs or floods stderr with library-loading errors cannot take the
others (or ``nndoctor env``) down with it; its stderr is kept, because TensorFlow reports
missing CUDA libraries there and nowhere else.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

FRAMEWORKS = ("torch", "tensorflow", "keras", "jax")
# The package that provides each framework's import name, in the order pip users install them.
DISTRIBUTIONS = {"torch": ("torch",), "tensorflow": ("tensorflow", "tensorflow-cpu", "tf-nightly", "tensorflow-gpu"),
                 "keras": ("keras",), "jax": ("jax",)}
COMPANIONS = ("torchvision", "torchaudio", "tensorboard", "jaxlib", "protobuf", "nvidia-ml-py")
PROBE_TIMEOUT_S = 180.0
_LIBRARY_ERROR = re.compile(
    r"(Could not load dynamic library '([^']+)'|(lib[\w.+-]+\.so[\w.]*): cannot open shared object file"
    r"|Cannot dlopen some GPU libraries|DNN library is not found|Could not find cuda drivers)")


@dataclass
class FrameworkFacts:
    name: str
    installed: bool = False
    importable: bool = False
    version: str | None = None
    facts: dict[str, Any] = field(default_factory=dict)
    import_error: str | None = None
    library_errors: list[str] = field(default_factory=list)  # lines naming unloadable libraries

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "installed": self.installed, "importable": self.importable,
                "version": self.version, "import_error": self.import_error,
                "library_errors": self.library_errors, **self.facts}


def installed_version(*distributions: str) -> str | None:
    for name in distributions:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def library_error_lines(text: str, limit: int = 10) -> list[str]:
    """Lines of a framework's output that say a (CUDA) shared library could not be loaded."""
    lines = []
    for line in text.splitlines():
        if _LIBRARY_ERROR.search(line) and line.strip() not in lines:
            lines.append(line.strip()[:300])
        if len(lines) >= limit:
            break
    return lines


def parse_probe_output(name: str, stdout: str, stderr: str, returncode: int | None) -> FrameworkFacts:
    facts = FrameworkFacts(name=name, installed=True)
    payload = None
    for line in stdout.splitlines():
        if line.startswith("NNDOCTOR-PROBE "):
            payload = json.loads(line[len("NNDOCTOR-PROBE "):])
    facts.library_errors = library_error_lines(stderr + "\n" + stdout)
    if payload is None:
        # The child died before reporting: a segfault or abort while importing is itself the fact.
        tail = (stderr.strip().splitlines() or [""])[-1][:300]
        facts.import_error = f"importing {name} killed the interpreter (exit {returncode}): {tail}".rstrip(": ")
        return facts
    facts.installed = bool(payload.pop("installed", True))
    facts.importable = bool(payload.pop("importable", False))
    facts.import_error = payload.pop("import_error", None)
    if facts.import_error:
        facts.library_errors += [e for e in library_error_lines(facts.import_error) if e not in facts.library_errors]
    payload.pop("name", None)
    facts.version = payload.pop("version", None)
    facts.facts = payload
    return facts


def probe_frameworks(names: tuple[str, ...] = FRAMEWORKS, python: str = sys.executable) -> dict[str, FrameworkFacts]:
    """Import every installed framework in its own child process, all in parallel."""
    script = os.path.join(os.path.dirname(__file__), "probe_script.py")
    results: dict[str, FrameworkFacts] = {}
    running = {}
    # A neutral working directory: the user's folder may hold files that shadow modules,
    # which ``nndoctor env`` reports separately; here we want the installation itself.
    cwd = tempfile.gettempdir()
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "0", "PYTHONDONTWRITEBYTECODE": "1"}
    for name in names:
        if installed_version(*DISTRIBUTIONS[name]) is None:
            results[name] = FrameworkFacts(name=name)
            continue
        running[name] = subprocess.Popen([python, script, name], cwd=cwd, env=env, text=True,
                                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    for name, process in running.items():
        try:
            stdout, stderr = process.communicate(timeout=PROBE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            stdout, stderr = process.communicate()
            results[name] = FrameworkFacts(name=name, installed=True,
                                           import_error=f"importing {name} did not finish within {PROBE_TIMEOUT_S:.0f} s",
                                           library_errors=library_error_lines(stderr))
            continue
        results[name] = parse_probe_output(name, stdout, stderr, process.returncode)
    return {name: results[name] for name in names}


def companion_versions() -> dict[str, str | None]:
    return {name: installed_version(name) for name in COMPANIONS}
