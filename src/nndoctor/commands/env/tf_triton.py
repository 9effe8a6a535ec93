"""TensorFlow ≥ 2.20 and triton ≥ 3.7 in one environment: ``import triton`` after TensorFlow segfaults.

TensorFlow's PyPI wheels from 2.20 on ship ``tensorflow/python/pywrap_dlopen_global_flags.py``,
so ``_pywrap_tensorflow_internal.so`` is loaded with ``RTLD_GLOBAL`` and TensorFlow's statically
linked LLVM lands in the process's global symbol table; triton ≥ 3.7's ``libtriton`` then binds
its own LLVM calls to that ABI-incompatible copy and crashes while loading
(https://github.com/tensorflow/tensorflow/issues/124205). torch imports triton lazily (the first
``optimizer.step()``, ``torch.compile``), so a script that imports TensorFlow first dies there.

The facts come from the package metadata (nothing is imported here); one child process then
tries the crashing order, only when the metadata says the pair is installed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from importlib import metadata

from packaging.version import InvalidVersion, Version

TF_DISTRIBUTIONS = ("tensorflow", "tensorflow-cpu", "tf-nightly", "tensorflow-gpu")
FIRST_TF = Version("2.20")  # the first wheels that ship the RTLD_GLOBAL helper (issue #124205)
FIRST_TRITON = Version("3.7")  # the first triton whose libtriton exports its LLVM (issue #124205)
GLOBAL_FLAGS_FILE = "tensorflow/python/pywrap_dlopen_global_flags.py"
TF_IMPORTED = "NNDOCTOR-TF-IMPORTED"
PROBE_TIMEOUT_S = 180.0
# The crashing order, with a marker between the two imports so a crash can be placed.
PROBE_CODE = f"import tensorflow; print({TF_IMPORTED!r}, flush=True); import triton"


@dataclass
class TfTritonFacts:
    tf_distribution: str | None = None
    tf_version: str | None = None
    triton_version: str | None = None
    # True/False: the TensorFlow wheel's RECORD lists (or not) the RTLD_GLOBAL helper;
    # None: the installer left no file list (conda, some system packages).
    global_flags_file: bool | None = None
    probe_returncode: int | None = None  # None: no probe ran
    probe_tf_imported: bool = False  # the child got past ``import tensorflow``
    probe_error: str | None = None  # timeout or a failure to start the child

    @property
    def at_risk(self) -> bool:
        """Versions (and, where listed, the wheel's files) of a pair that crashes."""
        if self.global_flags_file is False:
            return False  # a wheel built without the helper loads TensorFlow RTLD_LOCAL
        return _at_least(self.tf_version, FIRST_TF) and _at_least(self.triton_version, FIRST_TRITON)

    @property
    def probe_crashed(self) -> bool:
        """The child died of a signal (SIGSEGV is -11; a shell reports it as 139)."""
        return self.probe_returncode is not None and (self.probe_returncode < 0 or self.probe_returncode >= 128)

    def to_json(self) -> dict[str, object]:
        return {"tf_distribution": self.tf_distribution, "tf_version": self.tf_version,
                "triton_version": self.triton_version, "global_flags_file": self.global_flags_file,
                "probe_returncode": self.probe_returncode, "probe_tf_imported": self.probe_tf_imported,
                "probe_error": self.probe_error}


def _at_least(text: str | None, bound: Version) -> bool:
    if not text:
        return False
    try:
        # Pre-releases and nightlies of the bound (2.20.0rc0, 2.21.0.dev2025…) count as the bound.
        return Version(text).release >= bound.release
    except InvalidVersion:
        return False


def read_versions() -> TfTritonFacts:
    """The installed TensorFlow and triton, from ``importlib.metadata`` only."""
    facts = TfTritonFacts()
    for name in TF_DISTRIBUTIONS:
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        facts.tf_distribution, facts.tf_version = name, dist.version
        files = dist.files
        if files is not None:
            facts.global_flags_file = any(str(path).replace("\\", "/") == GLOBAL_FLAGS_FILE for path in files)
        break
    try:
        facts.triton_version = metadata.version("triton")
    except metadata.PackageNotFoundError:
        pass
    return facts


def start_probe(python: str = sys.executable) -> subprocess.Popen[str] | None:
    """Start ``import tensorflow; import triton`` in a child; None when it could not start."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONDONTWRITEBYTECODE": "1"}
    try:
        return subprocess.Popen([python, "-c", PROBE_CODE], cwd=tempfile.gettempdir(), env=env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    except OSError:
        return None


def finish_probe(facts: TfTritonFacts, process: subprocess.Popen[str] | None,
                 timeout: float = PROBE_TIMEOUT_S) -> TfTritonFacts:
    """Wait for the child of ``start_probe`` and record how it ended."""
    if process is None:
        facts.probe_error = "the probe process could not be started"
        return facts
    try:
        stdout, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        stdout, _ = process.communicate()
        facts.probe_error = f"the probe did not finish within {timeout:.0f} s"
    facts.probe_tf_imported = TF_IMPORTED in (stdout or "")
    facts.probe_returncode = None if facts.probe_error else process.returncode
    return facts
