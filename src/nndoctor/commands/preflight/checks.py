"""The findings of preflight's active tests: M107 batch-mixing, H101 cannot-overfit-one-batch,
H102 gradcheck-failed. They come from tests run on copies (``preflight/active.py``), not from
watching events, so they have their own scope."""

from __future__ import annotations

from nndoctor.core.findings import Severity
from nndoctor.core.registry import Check, register


class PreflightCheck(Check):
    scope = "preflight"


@register
class BatchMixing(PreflightCheck):
    """
    ## What it does
    On a copy of the model in eval mode, takes the gradient of sample 0's output with respect
    to the whole input batch: for a model that treats samples independently, the gradient
    for every other sample is exactly zero. If it is not, the test repeats the measurement at
    every submodule's output and names the first module where samples start to mix.

    ## Why is this bad?
    A ``view``/``reshape`` where a ``permute``/``transpose`` was meant, a reduction over
    ``dim=0``, a softmax over the batch axis or attention across the batch make each
    prediction depend on the other samples of the batch. Training still runs and the loss
    still falls, but the model learns from leaked information and behaves differently at
    batch size 1.

    ## Example
    ```python
    x = x.view(batch, channels, -1).view(-1, batch, channels)   # meant: x.permute(2, 0, 1)
    scores = torch.softmax(logits, dim=0)                        # normalises over the batch
    ```

    ## Use instead
    ```python
    x = x.flatten(2).permute(2, 0, 1)
    scores = torch.softmax(logits, dim=-1)
    ```

    ## References
    - A. Karpathy, "A Recipe for Training Neural Networks" (2019), "use backprop to chart dependencies": https://karpathy.github.io/2019/04/25/recipe/
    - torch.Tensor.view vs permute: https://pytorch.org/docs/stable/generated/torch.Tensor.view.html
    """

    code = "M107"
    name = "batch-mixing"
    severity = Severity.ERROR
    summary = "outputs of one sample depend on other samples of the batch outside BatchNorm (reshape/view across the batch dimension)"
    fix = "keep the batch dimension separate: permute/transpose instead of view/reshape across it, reduce over the feature dims"


@register
class CannotOverfitOneBatch(PreflightCheck):
    """
    ## What it does
    Trains a copy of the model on the first real batch alone, with a fresh optimizer of the
    user's class and settings (and once more with ten times the learning rate), for a
    bounded number of steps. A working pipeline drives the loss on a single batch to half its
    start or lower (or under 0.05). The finding is reported only when neither attempt lowered
    the loss by more than 10%, with both loss curves; anything in between is reported as
    inconclusive in the preflight table (a frozen backbone's head, a tiny learning rate), never
    as a finding.

    ## Why is this bad?
    A model that cannot even memorise one batch will not learn from the dataset: labels
    that do not belong to the inputs, a frozen or detached part of the graph, dead units,
    a loss that ignores the output. Finding this in seconds saves the GPU-hours a full run
    takes to show a flat curve.

    ## Example
    ```python
    logits = model(x).detach()          # the graph is cut: nothing trains
    loss = F.cross_entropy(logits.requires_grad_(), y)
    ```

    ## Use instead
    ```python
    loss = F.cross_entropy(model(x), y)
    ```

    ## References
    - A. Karpathy, "A Recipe for Training Neural Networks" (2019), "overfit one batch": https://karpathy.github.io/2019/04/25/recipe/
    - PyTorch Lightning, `overfit_batches`: https://lightning.ai/docs/pytorch/stable/debug/debugging_basic.html
    """

    code = "H101"
    name = "cannot-overfit-one-batch"
    severity = Severity.WARNING
    summary = "a copy of the model cannot drive the loss down on one real batch"
    fix = "check that the labels belong to the inputs, that no part of the graph is detached or frozen, and the learning rate"


@register
class GradcheckFailed(PreflightCheck):
    """
    ## What it does
    Finds every custom ``torch.autograd.Function`` the forward pass goes through, and compares
    its ``backward`` with finite differences on the inputs it was called with (in float64,
    along random directions, like ``torch.autograd.gradcheck(fast_mode=True)``).

    ## Why is this bad?
    A hand-written ``backward`` with a wrong sign, a missing factor or a wrong transpose
    trains the model with wrong gradients; the loss may still go down, just not where it
    should, and nothing ever raises.

    ## Example
    ```python
    class Square(torch.autograd.Function):
        @staticmethod
        def backward(ctx, grad):
            (x,) = ctx.saved_tensors
            return x * grad          # should be 2 * x * grad
    ```

    ## Use instead
    Fix the derivative, and keep a `torch.autograd.gradcheck` test next to the Function.

    ## References
    - torch.autograd.gradcheck: https://pytorch.org/docs/stable/generated/torch.autograd.gradcheck.gradcheck.html
    - Extending torch.autograd: https://pytorch.org/docs/stable/notes/extending.html
    """

    code = "H102"
    name = "gradcheck-failed"
    severity = Severity.ERROR
    summary = "a custom autograd Function's backward disagrees with finite differences"
    fix = "fix the Function's backward (compare it with torch.autograd.gradcheck on small float64 inputs)"
