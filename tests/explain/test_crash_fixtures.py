"""Every CPU crash fixture raises its real error under ``nndoctor run`` and is explained with
the right code, at the marked line, with the key evidence gathered from the live run."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from nndoctor.report import render_text
from tests.conftest import FIXTURES, expected_lines, run_script
from tests.snapshot import Masks, assert_findings_snapshot

CRASH = FIXTURES / "crash"


def crash_fixtures() -> list[Path]:
    # TensorFlow fixtures run in their own process (test_tf_crashes.py): Keras's backend here is torch.
    return sorted(p for p in CRASH.rglob("*.py") if "gpu" not in p.parts and "tensorflow" not in p.parts
                  and expected_lines(p))


def _text(finding) -> str:
    return f"{finding.message} {finding.evidence} {finding.fix}"


# Key evidence per fixture: what only the live run (or the message) could tell.
EVIDENCE = {
    "E101_unassigned_to_device": lambda f: (f.evidence["unassigned_move"].startswith("line 14")
                                            and "model.0 (Linear)" in f.message
                                            and "`x = x.to(device)`" in f.fix),
    "E102_float64_numpy_input": lambda f: f.evidence["found"] == "Double" and "model.0" in f.message
                                          and "x.float()" in f.fix,
    "E103_odd_image_in_folder": lambda f: (any(p.endswith("dog/2.png") for p in f.evidence["files"])
                                           and f.evidence["batch_indices"] == [4, 5, 6, 7]
                                           and "index 6" in f.message and "[3, 40, 50]" in f.message),
    "E103_odd_image_in_worker": lambda f: (f.evidence["batch_indices"] == [4, 5, 6, 7]
                                           and f.evidence["odd_samples"] == ["index 6 is [3, 24, 24]"]),
    "E104_channels_last_batch": lambda f: (f.evidence["layout"] == "channels_last"
                                           and "net.conv1 (Conv2d)" in f.message and "permute(0, 3, 1, 2)" in f.fix),
    "E105_linear_in_features": lambda f: f.evidence["features_received"] == 128 and "model.fc" in f.message,
    "E106_dataparallel_checkpoint": lambda f: (f.evidence["saved_prefix"] == "module." and "all 9 keys" in f.message
                                               and "consume_prefix_in_state_dict_if_present(state_dict, 'module.')" in f.fix),
    "E107_dataparallel_attribute": lambda f: "`model.module.fc`" in f.fix and f.evidence["inner_type"] == "Classifier",
    "E110_hidden_state_carried": lambda f: f.evidence["optimizer_steps"] == 1 and "detach" in f.message,
    "E111_inplace_after_sigmoid": lambda f: f.evidence["op"] == "Sigmoid" and "[3, 6]" in f.evidence["tensor"],
    "E112_backward_under_no_grad": lambda f: f.evidence["no_grad_block_line"] == 9,
    "E113_last_batch_of_one": lambda f: (f.evidence["dataset_size"] == 33 and f.evidence["batch_size"] == 32
                                         and "model.1 (BatchNorm1d)" in f.message and "drop_last=True" in f.fix),
    "E114_random_crop_too_large": lambda f: (any(p.endswith("b/img1.png") for p in f.evidence["files"])
                                             and f.evidence["crop"] == [24, 24]),
    "E115_worker_killed": lambda f: f.evidence["signal"] == "Bus error" and "shared memory" in f.message,
    "train": lambda f: f.evidence["shadowing_file"].endswith("E119_shadowing/datasets.py"),
    "E117_one_based_labels": lambda f: (f.evidence["target_range"] == [1, 3] and f.evidence["classes"] == 3
                                        and "y - 1" in f.fix),
    "E117_too_few_output_classes": lambda f: (f.evidence["target_range"] == [0, 6] and f.evidence["classes"] == 2
                                              and f.message.count("the model outputs") == 1
                                              and "out_features=7" in f.fix),
    "E118_view_folds_batch": lambda f: (f.evidence["input_batch"] == 8 and f.evidence["target_batch"] == 4
                                        and "flatten" in f.fix),
    "E122_lambda_with_spawn": lambda f: f.evidence["start_method"] == "spawn" and "<lambda>" in f.message,
    "E123_average_state_dicts": lambda f: "`average[key] *= 0.5`" in f.message and "expect" not in f.message,
    "E124_one_hot_targets": lambda f: f.evidence["target"] == "int64[4, 3]@cpu" and "argmax(dim=1)" in f.fix,
    "E125_if_on_tensor": lambda f: "`if`" in f.message and "if prediction == y:" in f.message,
    "E126_numpy_in_checkpoint": lambda f: ("numpy._core.multiarray._reconstruct" in f.evidence["globals"]
                                           and f.evidence["file"].endswith("checkpoint.pt")),
    "E128_relative_path": lambda f: f.evidence["exists_at"].endswith("crash/E128_data/classes.txt"),
    "E129_unused_parameter_ddp": lambda f: (f.evidence["parameters"] == ["aux_head.weight", "aux_head.bias"]
                                            and f.evidence["modules"] == ["aux_head"]),
    "E131_port_already_in_use": lambda f: isinstance(f.evidence["port"], int) and "already uses it" in f.message,
}


@pytest.fixture(autouse=True)
def _forget_shadowing_module():
    yield
    module = sys.modules.get("datasets")
    if module is not None and "E119_shadowing" in (getattr(module, "__file__", "") or ""):
        del sys.modules["datasets"]


@pytest.mark.parametrize("path", crash_fixtures(), ids=lambda p: p.stem if p.stem != "train" else p.parent.name)
def test_crash_is_explained_at_the_marked_line(path):
    (code, lines), = expected_lines(path).items()
    report = run_script(path, select=["E"])
    assert report.status == "crashed"
    assert report.traceback, "the user's traceback must be kept"
    explanations = [f for f in report.findings if f.code.startswith("E")]
    assert [f.code for f in explanations] == [code], render_text(report)
    finding = explanations[0]
    assert finding.location.path.endswith(path.name) and finding.location.line in lines, finding.location
    assert EVIDENCE[path.stem](finding), _text(finding)
    assert report.extra["crash"]["explained_by"] == code
    assert report.internal_errors == []
    # What the user reads, word for word (tests/snapshot.py; update with --snapshot-update).
    name = path.stem if path.stem != "train" else path.parent.name
    assert_findings_snapshot(f"crash/{name}", explanations, base=CRASH, masks=MEASURED.get(code, Masks()),
                             source=f"nndoctor run {path.relative_to(CRASH)} (crash explained)")


# What differs between runs and machines in a crash explanation, masked in its snapshot.
MEASURED: dict[str, Masks] = {
    "E115": Masks(why="the size of this machine's /dev/shm", evidence=("dev_shm_mib",)),
    "E131": Masks(why="the fixture binds a free port the OS picks", text=((r"on port \d+", "on port <port>"),),
                  evidence=("port",)),
}


def test_every_cpu_code_has_a_crash_fixture():
    from nndoctor.core.registry import all_checks

    gpu_only = {"E108", "E109", "E116", "E120", "E121", "E127"}  # recorded messages / notebook test
    gpu_only |= {"E130", "E132"}  # need several ranks: recorded messages, tests/distributed
    tensorflow = sorted((CRASH / "tensorflow").glob("*.py"))
    covered = {code for p in crash_fixtures() + tensorflow for code in expected_lines(p)}
    expected = {c.code for c in all_checks("explain")} - gpu_only
    assert expected <= covered, sorted(expected - covered)
