"""``nndoctor env``: the decisions on constructed facts, then the whole command against a
stand-in ``nvidia-smi`` on PATH, a stand-in CPU-only ``torch`` and a broken ``.dist-info``."""

from __future__ import annotations

import json
import os
import stat
import textwrap

import pytest

from nndoctor.cli import main
from nndoctor.commands.env.checks import (
    EnvFacts,
    arch_supported,
    diagnose,
    torch_install_command,
)
from nndoctor.commands.env.frameworks import FrameworkFacts, library_error_lines, parse_probe_output
from nndoctor.commands.env.nvidia import (
    DriverInfo,
    Gpu,
    GpuProcess,
    parse_app_rows,
    parse_cuda_version,
    parse_gpu_rows,
)
from nndoctor.commands.env.packages import unmet_requirements
from nndoctor.commands.env.render import cudnn_text
from nndoctor.commands.env.tf_triton import TfTritonFacts
from nndoctor.core.findings import Severity

H100 = Gpu(index=0, name="NVIDIA H100 80GB HBM3", uuid="GPU-1", memory_total_mib=81559,
           memory_used_mib=10, utilization_percent=0, compute_capability="9.0")


def _torch(cuda="12.4", count=1, archs=("sm_80", "sm_90"), version="2.5.1+cu124", **more):
    return FrameworkFacts("torch", installed=True, importable=True, version=version,
                          facts={"cuda_build": cuda, "device_count": count, "arch_list": list(archs),
                                 "cuda_available": bool(count), "cudnn": 90100, **more})


def _facts(torch=None, gpus=(H100,), driver_cuda="12.4", **more):
    driver = DriverInfo(present=True, source="nvidia-smi", driver_version="550.54", cuda_version=driver_cuda,
                        gpus=list(gpus))
    frameworks = {"torch": torch} if torch else {}
    return EnvFacts(driver=driver, frameworks=frameworks, companions={"tensorboard": "2.17"}, **more)


def _codes(facts):
    return sorted(f.code for f in diagnose(facts))


def test_healthy_gpu_machine_has_no_finding():
    assert _codes(_facts(_torch())) == []


def test_cpu_only_build_on_a_gpu_machine_is_an_error_with_the_install_command():
    found = diagnose(_facts(_torch(cuda=None, count=0, archs=(), version="2.5.1+cpu")))
    assert [f.code for f in found] == ["V102"]
    assert found[0].severity is Severity.ERROR
    assert "pip install --force-reinstall torch==2.5.1 --index-url https://download.pytorch.org/whl/cu124" in found[0].message
    assert found[0].fix.startswith("pip install")


def test_cuda_build_that_sees_no_gpu_names_cuda_visible_devices():
    found = diagnose(_facts(_torch(count=0), environ={"CUDA_VISIBLE_DEVICES": ""}))
    assert [f.code for f in found] == ["V101"]
    assert "CUDA_VISIBLE_DEVICES=''" in found[0].message


def test_driver_older_than_the_build():
    major = diagnose(_facts(_torch(cuda="13.0"), driver_cuda="12.2"))
    assert [(f.code, f.severity) for f in major] == [("V103", Severity.ERROR)]
    minor = diagnose(_facts(_torch(cuda="12.6"), driver_cuda="12.2"))
    assert [(f.code, f.severity) for f in minor] == [("V103", Severity.WARNING)]


@pytest.mark.parametrize("capability, archs, supported", [
    ("9.0", ["sm_80", "sm_90"], True),
    ("8.6", ["sm_80"], True),            # same major, higher minor: binary compatible
    ("8.0", ["sm_86"], False),           # lower minor than the build
    ("12.0", ["sm_50", "sm_90"], False),
    ("12.0", ["sm_90", "compute_90"], True),   # PTX JIT-compiles for newer GPUs
    ("9.0", ["sm_90a"], True),
    ("10.0", ["sm_90a"], False),
])
def test_arch_supported(capability, archs, supported):
    assert arch_supported(capability, archs) is supported


def test_unsupported_architecture():
    found = diagnose(_facts(_torch(archs=("sm_50", "sm_60", "sm_70"))))
    assert [f.code for f in found] == ["V107"]
    assert "compute capability 9.0" in found[0].message


def test_busy_gpu_lists_other_processes_but_not_ours():
    busy = Gpu(**{**H100.__dict__, "utilization_percent": 97.0})
    processes = [GpuProcess("GPU-1", 4242, 30000, "python"), GpuProcess("GPU-1", 7, 40000, "me")]
    facts = _facts(_torch(), gpus=(busy,), own_pids=frozenset({7}))
    facts.driver.processes = processes
    found = diagnose(facts)
    assert [f.code for f in found] == ["V106"]
    assert "pid 4242" in found[0].message and "pid 7" not in found[0].message
    facts.driver.processes = processes[1:]
    assert _codes(facts) == []


def test_missing_libraries_from_tensorflow_output():
    stderr = ("2024-01-01 W tensorflow/stream_executor/platform/default/dso_loader.cc:64] Could not load dynamic "
              "library 'libcudnn.so.8'; dlerror: libcudnn.so.8: cannot open shared object file\nunrelated line\n")
    assert len(library_error_lines(stderr)) == 1
    tf = parse_probe_output("tensorflow", 'NNDOCTOR-PROBE {"name": "tensorflow", "importable": true, '
                            '"version": "2.15.0", "cuda_build": "12.2", "gpus": []}', stderr, 0)
    facts = _facts(None)
    facts.frameworks["tensorflow"] = tf
    found = diagnose(facts)
    assert "V104" in [f.code for f in found]
    assert "libcudnn.so.8" in next(f for f in found if f.code == "V104").message


def test_a_probe_that_kills_the_interpreter_is_reported():
    facts = parse_probe_output("torch", "", "Segmentation fault", -11)
    assert not facts.importable and "exit -11" in facts.import_error


def test_keras_without_a_backend_says_how_to_choose_one():
    keras = FrameworkFacts("keras", installed=True, importable=False,
                           import_error="ModuleNotFoundError: No module named 'tensorflow'")
    facts = _facts(_torch())
    facts.frameworks["keras"] = keras
    found = diagnose(facts)
    assert [(f.code, f.severity) for f in found] == [("V105", Severity.WARNING)]
    assert "KERAS_BACKEND=torch" in found[0].fix


def test_unmet_requirement_from_a_temporary_dist_info(tmp_path, monkeypatch):
    info = tmp_path / "brokenpkg-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: brokenpkg\nVersion: 1.0\n"
                                   "Requires-Dist: torch==1.0.0\nRequires-Dist: nosuchpackage-xyz>=2\n"
                                   "Requires-Dist: pytest ; extra == 'test'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    unmet = [u for u in unmet_requirements() if u.package == "brokenpkg"]
    assert sorted(u.requirement for u in unmet) == ["nosuchpackage-xyz>=2", "torch==1.0.0"]
    assert next(u for u in unmet if u.requirement.startswith("torch")).installed  # the real one


def test_nvidia_smi_parsing():
    gpus, driver = parse_gpu_rows("0, NVIDIA H100 80GB HBM3, GPU-1, 81559, 1024, 3, 9.0, 550.54.15\n"
                                  "1, Tesla T4, GPU-2, 15360, [N/A], [Not Supported], 7.5, 550.54.15\n")
    assert driver == "550.54.15" and [g.compute_capability for g in gpus] == ["9.0", "7.5"]
    assert gpus[1].memory_used_mib is None
    assert parse_cuda_version("| NVIDIA-SMI 550.54.15   Driver Version: 550.54.15   CUDA Version: 12.4 |") == "12.4"
    assert parse_app_rows("GPU-1, 4242, 30000, python train.py")[0].pid == 4242


def test_install_command_picks_the_newest_tag_the_driver_runs():
    assert torch_install_command("2.5.1+cpu", "12.5").endswith("/whl/cu124")
    assert torch_install_command("2.9.0", "13.1").endswith("/whl/cu130")
    assert cudnn_text(8902) == "8.9.2" and cudnn_text(90100) == "9.1.0"


# -- the whole command ------------------------------------------------------------------------

STUB_SMI = """#!/bin/sh
case "$1" in
  --query-gpu=*) echo "0, NVIDIA H100 80GB HBM3, GPU-1, 81559, 12, 0, 9.0, 550.54.15" ;;
  --query-compute-apps=*) ;;
  *) echo "| NVIDIA-SMI 550.54.15   Driver Version: 550.54.15   CUDA Version: 12.4 |" ;;
esac
"""

FAKE_CPU_TORCH = '''
__version__ = "2.5.1+cpu"
__file__ = __file__
class version:
    cuda = None
    hip = None
class cuda:
    @staticmethod
    def is_available(): return False
    @staticmethod
    def device_count(): return 0
    @staticmethod
    def get_arch_list(): return []
class backends:
    class cudnn:
        @staticmethod
        def version(): return None
'''


def _stub_driver(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool = bin_dir / "nvidia-smi"
    tool.write_text(STUB_SMI)
    tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")


def test_env_command_gpu_machine_with_cpu_only_torch(tmp_path, monkeypatch, capsys):
    _stub_driver(tmp_path, monkeypatch)
    fake = tmp_path / "site"
    (fake / "torch").mkdir(parents=True)
    (fake / "torch" / "__init__.py").write_text(textwrap.dedent(FAKE_CPU_TORCH))
    # Only the probes' child processes see the stand-in torch (through PYTHONPATH).
    monkeypatch.setenv("PYTHONPATH", str(fake))
    monkeypatch.setenv("KERAS_BACKEND", "torch")
    # This test is about V102: skip the TensorFlow/triton crash probe (V109, tested in test_tf_triton.py).
    monkeypatch.setattr("nndoctor.commands.env.collect.read_versions", TfTritonFacts)
    out_json = tmp_path / "env.json"
    status = main(["env", "--dir", str(tmp_path), "--select", "V1", "--json", str(out_json)])
    out = capsys.readouterr().out
    assert status == 1
    assert "NVIDIA driver 550.54.15 (supports CUDA 12.4), 1 GPU(s)" in out
    assert "V102 cpu-only-build" in out
    report = json.loads(out_json.read_text())
    v102 = [f for f in report["findings"] if f["code"] == "V102"]
    assert v102 and v102[0]["severity"] == "error"
    assert "--index-url https://download.pytorch.org/whl/cu124" in v102[0]["fix"]
    assert report["extra"]["environment"]["frameworks"]["torch"]["cuda_build"] is None
    assert report["extra"]["environment"]["driver"]["gpus"][0]["compute_capability"] == "9.0"


def test_env_command_without_a_driver_reports_the_real_install(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # no nvidia-smi
    monkeypatch.setenv("KERAS_BACKEND", "torch")
    (tmp_path / "random.py").write_text("x = 1\n")
    # The TensorFlow/triton crash probe (V109, tested in test_tf_triton.py) is a second TensorFlow
    # import in a child process: ~10 CPU-seconds this test does not need.
    status = main(["env", "--dir", str(tmp_path), "--ignore", "V109", "--json", "-"])
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert report["extra"]["environment"]["driver"]["present"] is False
    torch_facts = report["extra"]["environment"]["frameworks"]["torch"]
    import torch

    assert torch_facts["version"] == torch.__version__ and torch_facts["importable"]
    assert report["extra"]["environment"]["shadowing"][0]["name"] == "random"
    assert any(f["code"] == "R102" for f in report["findings"])
    r102 = next(f for f in report["findings"] if f["code"] == "R102")
    # The exit status follows the findings; this machine's own packages may have real problems
    # too (V105: an unmet requirement of something installed beside the tests).
    errors = [f for f in report["findings"] if f["severity"] == "error"]
    assert status == (1 if errors else 0)
    assert r102["severity"] in ("error", "warning")
    assert "NVIDIA driver: none found" in captured.err


def test_unknown_selector_is_a_usage_error(capsys):
    assert main(["env", "--select", "Q999"]) == 2
    assert "unknown check code" in capsys.readouterr().err


@pytest.mark.parametrize("log, code", [
    ("AssertionError: Torch not compiled with CUDA enabled", "V102"),
    ("RuntimeError: CUDA error: no kernel image is available for execution on the device\n"
     "CUDA kernel errors might be asynchronously reported at some other API call", "V107"),
    ("RuntimeError: The NVIDIA driver on your system is too old (found version 11040).", "V103"),
    ("OSError: libcudnn.so.9: cannot open shared object file: No such file or directory", "V104"),
    ("RuntimeError: No CUDA GPUs are available", "V101"),
    ("RuntimeError: operator torchvision::nms does not exist", "V105"),
])
def test_explain_links_install_crashes_to_nndoctor_env(log, code, tmp_path, capsys):
    path = tmp_path / "log.txt"
    path.write_text(log + "\n")
    main(["explain", str(path)])
    out = " ".join(capsys.readouterr().out.split())
    assert f"{code} " in out and "nndoctor env" in out
