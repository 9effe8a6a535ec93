"""D103 is a warning only with evidence that the pipeline assumes RGB; otherwise info."""

from __future__ import annotations

from nndoctor.checks._rgb_evidence import code_only, source_evidence
from nndoctor.core.findings import Severity
from tests.conftest import BUGGY, FIXTURES, run_script

SCRIPT = FIXTURES / "scripts" / "blue_images.py"


def test_blue_images_from_scratch_are_info_at_most():
    found = run_script(SCRIPT, ["scratch"], select=["D103"]).by_code("D103")
    assert found and all(f.severity == Severity.INFO for f in found)
    assert found[0].evidence["rgb_evidence"] == []


def test_loaded_weights_make_it_a_warning():
    found = run_script(SCRIPT, ["load_state_dict"], select=["D103"]).by_code("D103")
    assert found and found[0].severity == Severity.WARNING
    assert "load_state_dict" in found[0].evidence["rgb_evidence"][0]


def test_imagenet_constants_in_the_source_make_it_a_warning():
    found = run_script(BUGGY / "D103_bgr_images.py", select=["D103"]).by_code("D103")
    assert found and found[0].severity == Severity.WARNING
    assert any("ImageNet" in e for e in found[0].evidence["rgb_evidence"])


def test_comments_and_docstrings_are_no_evidence(tmp_path):
    script = tmp_path / "train.py"
    script.write_text('"""Unlike cv2.imread, this reads RGB."""\n# mean 0.485 would be ImageNet\nx = 1\n')
    assert source_evidence(str(script)) == []
    script.write_text("import cv2\nimg = cv2.imread(path)\nnet = resnet18(weights='DEFAULT')\n")
    found = source_evidence(str(script))
    assert any("OpenCV" in e for e in found) and any("pretrained" in e for e in found)
    assert "cv2.imread" in code_only("img = cv2 . imread(p)  # x\n").replace(" ", "")
