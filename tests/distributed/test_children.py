"""Trainers a script starts itself with multiprocessing are instrumented and report back."""

from __future__ import annotations

import textwrap

from tests.conftest import BUGGY, expected_lines, run_script

HOGWILD = textwrap.dedent('''
    import multiprocessing as mp

    import torch
    from torch import nn


    def train(model, seed):
        torch.manual_seed(seed)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        for _ in range(4):
            loss = model(torch.randn(8, 4)).pow(2).mean()
            loss.backward()  # no zero_grad: gradients accumulate
            optimizer.step()


    if __name__ == "__main__":
        model = nn.Linear(4, 2)
        model.share_memory()
        workers = [mp.get_context("spawn").Process(target=train, args=(model, seed)) for seed in range(2)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
''')


def test_hogwild_workers_report_back_to_the_parent(tmp_path):
    script = tmp_path / "hogwild.py"
    script.write_text(HOGWILD)
    report = run_script(script, select=["O101"])
    found = report.by_code("O101")
    assert found, report.internal_errors
    assert found[0].ranks == [0, 1]  # one finding, both worker processes
    assert found[0].location.path.endswith("hogwild.py") and found[0].location.line == 13
    assert report.distributed["children"] and len(report.distributed["ranks"]) == 2
    assert report.steps == 4
    assert not report.internal_errors


LAUNCHER = textwrap.dedent('''
    import subprocess
    import sys

    subprocess.run([sys.executable, "-c", "print('training elsewhere')"], check=True)
''')


def test_a_launcher_that_trains_in_other_processes_is_not_reported_clean(tmp_path):
    from nndoctor.report import render_text

    script = tmp_path / "launcher.py"
    script.write_text(LAUNCHER)
    report = run_script(script)
    text = render_text(report)
    assert "No problems found" not in text
    assert "Nothing was observed" in text and "-m nndoctor run" in text
    assert report.extra["not_observed"]


def test_mp_spawn_ranks_in_fresh_interpreters_report_back_to_the_parent():
    """The other in-process ``mp.spawn`` fixtures start their ranks from a warm fork server
    (tests/warm_spawn.py); this one goes through torch's own spawn start method, a fresh
    interpreter per rank, as users run it."""
    from tests import warm_spawn

    with warm_spawn.cold():
        report = run_script(BUGGY / "X111_unreduced_accuracy.py", select=["X111"])
    assert report.status == "completed" and not report.internal_errors, report.internal_errors
    assert [f.location.line for f in report.by_code("X111") if f.location] == sorted(
        expected_lines(BUGGY / "X111_unreduced_accuracy.py")["X111"])

