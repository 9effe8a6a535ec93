"""watch() in a notebook: one HTML block, locations as "cell N, line M", the notebook named.

A real IPython shell runs the cells, its compiler naming cell files as ipykernel does
(a temporary ``.py`` per cell); it runs in a subprocess so IPython's process-wide setup
(display hook, history) stays out of the test session.
"""

from __future__ import annotations

import html
import json
import os
import sys
import textwrap

import pytest

from tests import childproc

pytest.importorskip("IPython")

DRIVER = textwrap.dedent('''\
    import hashlib, json, pathlib, sys
    from IPython.core.compilerop import CachingCompiler
    from IPython.core.interactiveshell import InteractiveShell
    import IPython.display

    folder = pathlib.Path(sys.argv[1])

    class KernelLikeCompiler(CachingCompiler):
        def get_code_name(self, raw_code, transformed_code, number):
            return str(folder / (hashlib.sha1(transformed_code.encode()).hexdigest()[:12] + ".py"))

    class ZMQInteractiveShell(InteractiveShell):
        """Named like ipykernel's shell."""

    shell = ZMQInteractiveShell.instance()
    shell.compile = KernelLikeCompiler()
    shown, printed = [], []
    IPython.display.display = lambda *objs, **kw: shown.extend(getattr(o, "data", o) for o in objs)
    cells = [
        "import torch\\nimport torch.nn as nn\\nimport nndoctor",
        "torch.manual_seed(0)\\n"
        "model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))\\n"
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.05)",
        "with nndoctor.watch(print_report=True) as report:\\n"
        "    for step in range(6):\\n"
        "        x, y = torch.randn(16, 8), torch.randint(0, 3, (16,))\\n"
        "        loss = nn.functional.cross_entropy(model(x).softmax(-1), y)\\n"
        "        loss.backward()\\n"
        "        optimizer.step()\\n"
        "        optimizer.zero_grad()",
    ]
    for cell in cells:
        result = shell.run_cell(cell, store_history=True)
        result.raise_error()
    codes = sorted(f.code for f in shell.user_ns["report"].findings)
    print(json.dumps({"shown": shown, "codes": codes}))
''')


@pytest.mark.slow
def test_watch_renders_one_html_block_with_cell_locations(tmp_path):
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    env = {**os.environ, "IPYTHONDIR": str(tmp_path / "ipython"),
           "JPY_SESSION_NAME": "/home/me/work/train-mnist.ipynb"}
    result = childproc.run([sys.executable, str(driver), str(tmp_path)], timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads(result.stdout.strip().splitlines()[-1])
    assert "L101" in data["codes"]
    assert len(data["shown"]) == 1  # one output block, not one per finding
    block = data["shown"][0]
    assert block.startswith("<iframe srcdoc=")
    page = html.unescape(block.split('srcdoc="', 1)[1].split('" title=', 1)[0])
    assert "<h1>nndoctor · train-mnist.ipynb</h1>" in page
    assert "cell 3, line 4" in page  # L101: the cross_entropy line of the third cell
    assert str(tmp_path) not in page.split('id="nndoctor-data"')[0]  # no temp file names shown
    assert 'id="plot-loss"' in page
    assert "nndoctor ·" not in result.stderr  # no text report besides the block
