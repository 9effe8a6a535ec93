"""R101, R102, C104, C105."""

from __future__ import annotations

import textwrap

import pytest

from nndoctor.checks.environment import (
    find_shadowing,
    imported_names,
    io_overhead_verdict,
    local_module_names,
    weights_only_effective,
)
from nndoctor.core.findings import Severity
from nndoctor.instrument.numerics_probe import looks_explicitly_seeded
from tests.conftest import run_script

TRAIN = """
    import torch, torch.nn as nn
    {seed}
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):
        opt.zero_grad(); model(torch.randn(8, 4)).sum().backward(); opt.step()
"""


def script(tmp_path, name, source):
    path = tmp_path / name
    path.write_text(textwrap.dedent(source))
    return path


# -- R101 -------------------------------------------------------------------------------------------
def test_seeding_torch_silences_r101_and_other_generators_are_listed(tmp_path):
    seeded = script(tmp_path, "seeded.py", TRAIN.format(seed="torch.manual_seed(1)"))
    assert not run_script(seeded, select=["R101"]).findings
    helper = script(tmp_path, "helper.py", TRAIN.format(seed="torch.random.manual_seed(1)"))
    assert not run_script(helper, select=["R101"]).findings
    partial = script(tmp_path, "partial.py", TRAIN.format(seed="import random; random.seed(1)"))
    (finding,) = run_script(partial, select=["R101"]).by_code("R101")
    assert "seeded: random" in finding.message and finding.severity == Severity.INFO


def test_seed_patches_observe_without_changing_the_generator(tmp_path):
    import torch

    original = torch.manual_seed
    torch.manual_seed(123)
    expected = torch.rand(3)
    path = script(tmp_path, "draw.py", """
        import torch
        torch.manual_seed(123)
        drawn = torch.rand(3)
        torch.save(drawn, __file__ + ".pt")
    """)
    run_script(path, select=["R101"])
    assert torch.equal(torch.load(str(path) + ".pt"), expected)
    assert torch.manual_seed is original  # the patch is undone after the run


def test_watch_recognises_a_process_seeded_before_it_started():
    import torch
    import torch.nn as nn

    import nndoctor

    torch.manual_seed(7)
    with nndoctor.watch(select=["R101"]) as report:
        model = nn.Linear(4, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model(torch.randn(8, 4)).sum().backward()
        opt.step()
    assert not report.findings


def test_default_torch_seed_is_not_taken_for_an_explicit_one():
    assert looks_explicitly_seeded(0) and looks_explicitly_seeded(42) and looks_explicitly_seeded(2**32 - 1)
    assert not looks_explicitly_seeded(16529607298392239169)  # a default 64-bit seed


# -- R102 -------------------------------------------------------------------------------------------
def test_local_names_and_imports(tmp_path):
    (tmp_path / "random.py").write_text("")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "not-a-module.py").write_text("")
    assert set(local_module_names(str(tmp_path))) == {"random", "pkg"}
    train = script(tmp_path, "train.py", "import os.path\nfrom json import loads\nfrom . import x\n")
    assert imported_names(str(train)) == {"os": 1, "json": 2}


def origins(table):
    return lambda name: table.get(name)


def test_shadowing_rules(tmp_path):
    for name in ("random.py", "test.py", "utils.py", "rich.py"):
        (tmp_path / name).write_text("")
    real = {"random": "stdlib", "test": "stdlib", "utils": "/site/utils/__init__.py", "rich": "/site/rich/__init__.py"}
    loaded = {"random": "/usr/lib/python3.11/random.py", "utils": str(tmp_path / "utils.py"),
              "rich": "/site/rich/__init__.py"}
    found = {s.name: s for s in find_shadowing(str(tmp_path), set(), loaded, origins(real))}
    # stdlib name in use -> reported; unused stdlib name (test.py) -> not; a local utils.py the
    # run deliberately imports over an unused installed `utils` -> not; an installed module the
    # run uses from site-packages -> reported.
    assert set(found) == {"random", "rich"}
    assert not found["random"].active
    found = find_shadowing(str(tmp_path), set(), {"random": str(tmp_path / "random.py")}, origins(real))
    assert [s.active for s in found] == [True]


def test_shadowing_file_beside_a_script_is_reported_at_its_import(tmp_path):
    (tmp_path / "random.py").write_text("")  # `random` is already loaded: harmless in-process
    path = script(tmp_path, "train.py", "import random\n" + textwrap.dedent(TRAIN.format(seed="torch.manual_seed(0)")))
    (finding,) = run_script(path, select=["R102"]).by_code("R102")
    assert finding.location.line == 1 and "standard library" in finding.message
    assert "plain `python`" in finding.message


# -- C104 -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("passed, version, env, expected", [
    (None, "2.6.0", {}, True),
    (None, "2.14.1+cu130", {}, True),
    (None, "2.5.1", {}, False),
    (False, "2.6.0", {}, False),
    (True, "2.4.0", {}, True),
    (None, "2.6.0", {"TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"}, False),
    (False, "2.6.0", {"TORCH_FORCE_WEIGHTS_ONLY_LOAD": "1"}, True),
])
def test_effective_weights_only(passed, version, env, expected):
    assert weights_only_effective(passed, version, env) is expected


def test_loading_a_file_this_run_wrote_is_info_only(tmp_path):
    path = script(tmp_path, "resume.py", f"""
        import torch, torch.nn as nn
        torch.manual_seed(0)
        model = nn.Linear(4, 2)
        torch.save(model.state_dict(), {str(tmp_path / 'own.pt')!r})
        model.load_state_dict(torch.load({str(tmp_path / 'own.pt')!r}, weights_only=False))
        model.load_state_dict(torch.load({str(tmp_path / 'own.pt')!r}))
    """)
    (finding,) = run_script(path, select=["C104"]).by_code("C104")
    assert finding.severity == Severity.INFO and finding.location.line == 6


# -- C105 -------------------------------------------------------------------------------------------
def test_io_overhead_needs_periodic_saves_above_the_fraction():
    assert io_overhead_verdict([0.1, 0.1, 0.1], 2.0, 0.10, 3) == pytest.approx(0.15)
    assert io_overhead_verdict([0.5], 2.0, 0.10, 3) is None  # one final save
    assert io_overhead_verdict([0.01, 0.01, 0.01], 2.0, 0.10, 3) is None
    assert io_overhead_verdict([0.1, 0.1, 0.1], 0.0, 0.10, 3) is None
