"""L102: a sigmoid before BCEWithLogitsLoss — give the loss the logits."""

from __future__ import annotations

from nndoctor.commands.fix.codemods._losses import drop_activation
from nndoctor.commands.fix.syntax import FixContext

CODE = "L102"
SAFE = True


def propose(ctx: FixContext) -> tuple[str, str]:
    return drop_activation(ctx, functions={"binary_cross_entropy_with_logits"}, classes={"BCEWithLogitsLoss"},
                           activations={"sigmoid"}, modules={"Sigmoid"})
