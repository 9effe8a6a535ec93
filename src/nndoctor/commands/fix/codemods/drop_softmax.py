"""L101: a softmax before cross-entropy — give the loss the logits."""

from __future__ import annotations

from nndoctor.commands.fix.codemods._losses import drop_activation
from nndoctor.commands.fix.syntax import FixContext

CODE = "L101"
SAFE = True


def propose(ctx: FixContext) -> tuple[str, str]:
    return drop_activation(ctx, functions={"cross_entropy"}, classes={"CrossEntropyLoss"},
                           activations={"softmax"}, modules={"Softmax"})
