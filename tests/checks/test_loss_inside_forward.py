"""A loss module the model calls inside its own forward (Hugging Face models compute
``CrossEntropyLoss()(logits, labels)`` in ``forward`` when given labels) is a loss like any other:
the loss checks see it."""

from __future__ import annotations

import textwrap

from tests.conftest import run_script

SCRIPT = textwrap.dedent('''
    import torch
    from torch import nn

    class Classifier(nn.Module):
        def __init__(self):
            super().__init__()
            self.head = nn.Linear(8, 4)

        def forward(self, x, labels=None):
            probs = self.head(x).softmax(-1)
            loss = nn.CrossEntropyLoss()(probs, labels) if labels is not None else None
            return loss, probs

    torch.manual_seed(0)
    model = Classifier()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(6):
        x, y = torch.randn(16, 8), torch.randint(0, 4, (16,))
        loss, _ = model(x, labels=y)  # the loss is computed inside forward
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
''')


def test_a_loss_module_inside_the_models_forward_is_checked(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    report = run_script(script, select=["L101"])
    (finding,) = [f for f in report.findings if f.code == "L101"]
    assert finding.location.path.endswith("train.py")
    assert not report.internal_errors
