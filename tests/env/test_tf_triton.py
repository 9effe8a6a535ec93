"""V109: TensorFlow >= 2.20 and triton >= 3.7 in one environment (importing triton after TensorFlow
segfaults). Everything here is fake metadata or fake child processes: importing TensorFlow in a
pytest worker that later imports triton (torch does, lazily) would crash the worker."""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata

import pytest

from nndoctor.commands.env import tf_triton
from nndoctor.commands.env.checks import EnvFacts, diagnose
from nndoctor.commands.env.frameworks import FrameworkFacts
from nndoctor.commands.env.tf_triton import (
    GLOBAL_FLAGS_FILE,
    TF_IMPORTED,
    TfTritonFacts,
    finish_probe,
    read_versions,
)
from nndoctor.core.findings import Severity


class _FakeDistribution:
    def __init__(self, version: str, files: list[str] | None) -> None:
        self.version = version
        self.files = files


def _fake_metadata(monkeypatch, installed: dict[str, tuple[str, list[str] | None]]) -> None:
    """Make ``importlib.metadata`` (as tf_triton sees it) list only ``installed``."""
    def distribution(name):
        if name not in installed:
            raise metadata.PackageNotFoundError(name)
        return _FakeDistribution(*installed[name])

    def version(name):
        return distribution(name).version

    monkeypatch.setattr(tf_triton.metadata, "distribution", distribution)
    monkeypatch.setattr(tf_triton.metadata, "version", version)


TF_FILES = ["tensorflow/__init__.py", GLOBAL_FLAGS_FILE, "tensorflow/python/pywrap_tensorflow.py"]


@pytest.mark.parametrize("installed, at_risk", [
    ({"tensorflow-cpu": ("2.21.0", TF_FILES), "triton": ("3.8.0", [])}, True),
    ({"tensorflow": ("2.20.0", TF_FILES), "triton": ("3.7.0", [])}, True),
    ({"tf-nightly": ("2.22.0.dev20260801", TF_FILES), "triton": ("3.7.1", [])}, True),
    ({"tensorflow": ("2.20.0rc0", None), "triton": ("3.7.0", None)}, True),  # no RECORD: versions decide
    ({"tensorflow": ("2.19.0", TF_FILES), "triton": ("3.8.0", [])}, False),
    ({"tensorflow": ("2.21.0", TF_FILES), "triton": ("3.6.0", [])}, False),
    ({"tensorflow": ("2.21.0", TF_FILES)}, False),
    ({"triton": ("3.8.0", [])}, False),
    # A wheel built without the RTLD_GLOBAL helper (tensorflow/tensorflow#124230) loads TF locally.
    ({"tensorflow": ("2.21.0", ["tensorflow/__init__.py"]), "triton": ("3.8.0", [])}, False),
])
def test_versions_and_wheel_files_decide_the_risk(monkeypatch, installed, at_risk):
    _fake_metadata(monkeypatch, installed)
    facts = read_versions()
    assert facts.at_risk is at_risk
    findings = diagnose(EnvFacts(tf_triton=facts))
    assert [f.code for f in findings if f.code == "V109"] == (["V109"] if at_risk else [])


def test_metadata_only_finding_is_a_warning_naming_the_versions(monkeypatch):
    _fake_metadata(monkeypatch, {"tensorflow-cpu": ("2.21.0", TF_FILES), "triton": ("3.8.0", [])})
    facts = read_versions()
    assert facts.tf_distribution == "tensorflow-cpu" and facts.global_flags_file is True
    [finding] = [f for f in diagnose(EnvFacts(tf_triton=facts)) if f.code == "V109"]
    assert finding.severity == Severity.WARNING
    assert "tensorflow-cpu 2.21.0 and triton 3.8.0" in finding.message
    assert "pywrap_dlopen_global_flags.py" in finding.message and "no probe ran" in finding.message
    assert "import triton" in finding.fix


def _pair(**probe) -> TfTritonFacts:
    return TfTritonFacts(tf_distribution="tensorflow", tf_version="2.21.0", triton_version="3.8.0",
                         global_flags_file=True, **probe)


def test_a_probe_that_dies_at_import_triton_makes_it_an_error():
    [finding] = [f for f in diagnose(EnvFacts(tf_triton=_pair(probe_returncode=-11, probe_tf_imported=True)))
                 if f.code == "V109"]
    assert finding.severity == Severity.ERROR
    assert "SIGSEGV (exit -11) at `import triton`" in finding.message
    assert finding.evidence["probe_returncode"] == -11


def test_a_probe_that_imports_both_cleanly_silences_the_check():
    findings = diagnose(EnvFacts(tf_triton=_pair(probe_returncode=0, probe_tf_imported=True)))
    assert "V109" not in [f.code for f in findings]


def test_a_probe_that_dies_inside_import_tensorflow_is_not_claimed_as_confirmed():
    [finding] = [f for f in diagnose(EnvFacts(tf_triton=_pair(probe_returncode=-6, probe_tf_imported=False)))
                 if f.code == "V109"]
    assert finding.severity == Severity.WARNING
    assert "could not get past `import tensorflow` (SIGABRT (exit -6))" in finding.message


def test_tensorflow_probe_killed_with_keras_backend_torch_is_attributed():
    killed = FrameworkFacts("tensorflow", installed=True, importable=False,
                            import_error="importing tensorflow killed the interpreter (exit -11): I0000 port.cc:153]")
    facts = EnvFacts(frameworks={"tensorflow": killed}, environ={"KERAS_BACKEND": "torch"},
                     tf_triton=_pair(probe_returncode=-11, probe_tf_imported=False))
    findings = diagnose(facts)
    [finding] = [f for f in findings if f.code == "V109"]
    assert finding.severity == Severity.ERROR
    assert "KERAS_BACKEND=torch `import tensorflow` alone killed the interpreter with SIGSEGV (exit -11)" in finding.message
    # V109 explains the crash, so the generic "tensorflow fails to import" (V105) is not repeated.
    assert not [f for f in findings if f.code == "V105" and f.evidence.get("framework") == "tensorflow"]


def test_tensorflow_probe_killed_without_the_pair_stays_a_generic_import_failure():
    killed = FrameworkFacts("tensorflow", installed=True, importable=False,
                            import_error="importing tensorflow killed the interpreter (exit -11)")
    old = TfTritonFacts(tf_distribution="tensorflow", tf_version="2.19.0", triton_version="3.8.0")
    findings = diagnose(EnvFacts(frameworks={"tensorflow": killed}, environ={"KERAS_BACKEND": "torch"}, tf_triton=old))
    assert "V109" not in [f.code for f in findings]
    assert [f for f in findings if f.code == "V105" and f.evidence.get("framework") == "tensorflow"]


def _child(code: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", code], text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL)


def test_finish_probe_records_a_segfault_after_the_marker():
    process = _child(f"import os, signal; print({TF_IMPORTED!r}, flush=True); os.kill(os.getpid(), signal.SIGSEGV)")
    facts = finish_probe(_pair(), process, timeout=30)
    assert facts.probe_returncode == -11 and facts.probe_tf_imported and facts.probe_crashed


def test_finish_probe_records_a_clean_exit_and_a_timeout():
    clean = finish_probe(_pair(), _child(f"print({TF_IMPORTED!r})"), timeout=30)
    assert clean.probe_returncode == 0 and clean.probe_tf_imported and not clean.probe_crashed
    hung = finish_probe(_pair(), _child("import time; time.sleep(60)"), timeout=0.5)
    assert hung.probe_returncode is None and "did not finish within" in (hung.probe_error or "")


def test_a_probe_that_cannot_start_is_reported():
    assert tf_triton.start_probe(python="/nonexistent/python") is None
    facts = finish_probe(_pair(), None)
    [finding] = [f for f in diagnose(EnvFacts(tf_triton=facts)) if f.code == "V109"]
    assert finding.severity == Severity.WARNING and "could not be started" in finding.message
