"""Layers that misbehave in eval mode: M109 spectral-norm-never-updated,
M110 functional-dropout-in-eval."""

from __future__ import annotations

import weakref
from typing import Any

import torch

from nndoctor.core.events import Forward
from nndoctor.core.findings import Severity
from nndoctor.core.registry import Check, register
from nndoctor.core.subscribers import model_forwards_only, sampled_training_forwards
from nndoctor.instrument.dropout_probe import dropout_records

# The stored power-iteration estimate is stale when it is below this share of the true
# largest singular value: the normalised weight is then ≥ 1.25× too large.
STALE_SIGMA_RATIO = 0.8
_MAX_SVD_NUMEL = 4_000_000


def spectral_norm_parts(module: Any) -> list[tuple[str, torch.Tensor, torch.Tensor, torch.Tensor]]:
    """(name, weight matrix, u, v) of each spectral norm on the module itself: the hook form
    (``torch.nn.utils.spectral_norm``) and the parametrization form
    (``torch.nn.utils.parametrizations.spectral_norm``)."""
    found = []
    for hook in list(getattr(module, "_forward_pre_hooks", {}).values()):
        if type(hook).__name__ == "SpectralNorm" and hasattr(hook, "reshape_weight_to_matrix"):
            name = hook.name
            weight = getattr(module, name + "_orig", None)
            u, v = getattr(module, name + "_u", None), getattr(module, name + "_v", None)
            if weight is not None and u is not None and v is not None:
                found.append((name, hook.reshape_weight_to_matrix(weight), u, v))
    parametrizations = getattr(module, "parametrizations", None)
    if parametrizations is not None:
        for name, chain in parametrizations.items():
            for p in chain:
                if type(p).__name__ == "_SpectralNorm" and hasattr(p, "_u"):
                    found.append((name, p._reshape_weight_to_matrix(chain.original), p._u, p._v))
    return found


def stored_and_true_sigma(matrix: torch.Tensor, u: torch.Tensor, v: torch.Tensor) -> tuple[float, float] | None:
    """The power iteration's current estimate uᵀWv and the true largest singular value."""
    if matrix.numel() > _MAX_SVD_NUMEL or matrix.is_meta or not matrix.is_floating_point():
        return None
    with torch.no_grad():
        w = matrix.detach().float()
        stored = torch.dot(u.detach().float(), w @ v.detach().float())
        true = torch.linalg.matrix_norm(w, ord=2)
        values = torch.stack([stored, true]).cpu().tolist()
    return float(values[0]), float(values[1])


@register
class SpectralNormNeverUpdated(Check):
    """
    ## What it does
    When a model is run in eval mode, looks at each of its spectral-normalised layers that
    has not run a training-mode forward in this run, and compares the normalisation the
    layer applies — σ = uᵀWv from its stored power-iteration vectors — with the weight's true
    largest singular value. It reports when the stored σ is below 80% of the true one (the
    layer's weight is then at least 1.25× too large, often far more: freshly built
    vectors are random, so σ can be near zero or negative).

    ## Why is this bad?
    Spectral normalisation estimates σ by one power-iteration step per *training-mode*
    forward; in eval mode it reuses the stored vectors. ``torch.nn.utils.spectral_norm``
    creates them at random and runs no iteration until the first training forward, so a
    model evaluated (or exported, or used to generate samples) before that divides its
    weights by a meaningless number. Outputs are wrong, with no error.

    ## Example
    ```python
    disc = nn.Sequential(spectral_norm(nn.Linear(64, 128)), nn.LeakyReLU(0.2), nn.Linear(128, 1))
    disc.eval()
    with torch.no_grad():
        baseline = disc(real).mean()        # u, v still random
    ```

    ## Use instead
    ```python
    disc.train()
    with torch.no_grad():
        disc(real)                          # one training-mode forward runs the power iteration
    disc.eval()
    ```
    or ``torch.nn.utils.parametrizations.spectral_norm``, which runs 15 power iterations when
    it is applied (not reported unless the weight changed since without a training forward).

    ## References
    - Miyato et al., "Spectral Normalization for Generative Adversarial Networks", ICLR 2018: https://arxiv.org/abs/1802.05957
    - PyTorch docs, ``torch.nn.utils.spectral_norm``: https://pytorch.org/docs/stable/generated/torch.nn.utils.spectral_norm.html
    - PyTorch docs, ``torch.nn.utils.parametrizations.spectral_norm``: https://pytorch.org/docs/stable/generated/torch.nn.utils.parametrizations.spectral_norm.html
    """

    code = "M109"
    name = "spectral-norm-never-updated"
    severity = Severity.ERROR
    summary = "a spectral-normalized module evaluated before any training-mode forward (power iteration never ran)"
    fix = "run one training-mode forward (model.train(); model(x)) before evaluating, or use parametrizations.spectral_norm"

    def __init__(self, session) -> None:
        super().__init__(session)
        self._layers: weakref.WeakKeyDictionary[Any, list[weakref.ref]] = weakref.WeakKeyDictionary()
        self._iterated: weakref.WeakSet = weakref.WeakSet()
        self._done: weakref.WeakSet = weakref.WeakSet()
        self._last: tuple[weakref.ref, list[weakref.ref]] | None = None

    def _pending_refs(self, root: Any) -> list[weakref.ref]:
        """The root's spectral-normalized layers not decided yet (a layer is decided once: at
        its first forward), remembered for the last root seen (one look-up a forward, not a
        weak-dictionary walk)."""
        last = self._last
        if last is not None and last[0]() is root:
            return last[1]
        refs = self._layers.get(root)
        if refs is None:
            refs = [weakref.ref(m) for m in root.modules() if spectral_norm_parts(m)]
            self._layers[root] = refs
        self._last = (weakref.ref(root), refs)
        return refs

    @sampled_training_forwards
    @model_forwards_only
    def on_forward(self, event: Forward) -> None:
        if event.is_loss:
            return
        refs = self._pending_refs(event.module)
        if not refs:  # the usual forward: no spectral norm, or every layer decided
            return
        for layer in [m for m in (r() for r in refs) if m is not None]:
            if layer in self._done:
                continue
            if layer.training:
                self._iterated.add(layer)  # its power iteration ran in this forward
                self._done.add(layer)
                continue
            self._done.add(layer)
            self._inspect(event, layer)
        # Decided layers are never looked at again: keep only the live, undecided ones.
        refs[:] = [r for r in refs if (m := r()) is not None and m not in self._done]

    def _inspect(self, event: Forward, layer: Any) -> None:
        for name, matrix, u, v in spectral_norm_parts(layer):
            sigmas = stored_and_true_sigma(matrix, u, v)
            if sigmas is None:
                continue
            stored, true = sigmas
            if true <= 0 or stored >= STALE_SIGMA_RATIO * true:
                continue
            self.report(
                f"{type(event.module).__name__} runs in eval mode while its spectral-normalised "
                f"{type(layer).__name__}.{name} never ran a training-mode forward: the stored power "
                f"iteration gives σ = {stored:.3g} but the weight's largest singular value is {true:.3g}, "
                f"so the layer's weight is divided by the wrong number.",
                location=event.location,
                evidence={"layer": type(layer).__name__, "parameter": name, "stored_sigma": stored,
                          "true_sigma": true},
                step=event.step,
            )
            return


@register
class FunctionalDropoutInEval(Check):
    """
    ## What it does
    Watches calls of ``torch.nn.functional.dropout`` (and ``dropout1d/2d/3d``,
    ``alpha_dropout``, ``feature_alpha_dropout``) made without a ``training`` argument,
    with ``p > 0``, while the module whose ``forward`` makes the call is in eval mode.

    ## Why is this bad?
    ``F.dropout``'s ``training`` argument defaults to ``True``: it does not follow
    ``model.eval()``. Evaluation keeps dropping activations, so validation accuracy is
    noisy and lower than the model's, predictions are not deterministic, and exported models
    behave randomly. ``nn.Dropout`` modules (what M101 looks at) do follow the mode.

    ## Example
    ```python
    def forward(self, x):
        x = F.relu(self.fc1(x))
        x = F.dropout(x, 0.5)          # always on
        return self.fc2(x)
    ```

    ## Use instead
    ```python
        x = F.dropout(x, 0.5, training=self.training)
    ```
    or an ``nn.Dropout(0.5)`` submodule. An explicit ``training=True`` (Monte-Carlo dropout)
    is deliberate and not reported.

    ## References
    - PyTorch docs, ``torch.nn.functional.dropout`` (``training`` defaults to True): https://pytorch.org/docs/stable/generated/torch.nn.functional.dropout.html
    - PyTorch docs, ``torch.nn.Dropout`` (follows ``Module.train()/eval()``): https://pytorch.org/docs/stable/generated/torch.nn.Dropout.html
    """

    code = "M110"
    name = "functional-dropout-in-eval"
    severity = Severity.ERROR
    summary = "`F.dropout` without `training=self.training` stays on after `model.eval()`"
    fix = "pass training=self.training to F.dropout (or use an nn.Dropout module)"
    needs = frozenset({"dropout_calls"})
    # Not dispatched until the dropout probe records a call (the usual forward has none).
    idle_handlers = ("forward",)

    def __init__(self, session) -> None:
        super().__init__(session)
        self._records = dropout_records(session)
        self._records.on_pending = lambda: session.arm(self, "forward")

    def on_forward(self, event: Forward) -> None:
        records = self._records
        if not records.pending:  # nothing since the last report
            return
        self.session.disarm(self, "forward")
        for call in records.take():
            self.report(
                f"F.{call.function}(p={call.p:g}) ran inside {call.module_type}.forward while the module is in "
                "eval mode: without training=self.training it keeps dropping activations after model.eval().",
                location=call.location or event.location,
                evidence={"function": call.function, "p": call.p, "module": call.module_type},
                step=call.step,
            )
