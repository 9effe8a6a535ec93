"""Classification that never leaves chance level: L108 loss-at-chance (the rule is
``nndoctor.chance_level``, shared with Keras)."""

from __future__ import annotations

import torch

from nndoctor.chance_level import BatchOutcome, at_chance, chance_sentence, confirmed, learning
from nndoctor.events import LossComputed, RunEnd
from nndoctor.findings import Location, Severity
from nndoctor.instrument.stats import has_plain_values
from nndoctor.registry import Check, register

# Vocabulary-sized targets (language models) are left out: the per-step argmax over a
# vocabulary is not free, and next-token targets are no "labels" that can be shuffled.
MAX_CLASSES = 1000
# The test is about the first steps: a run still undecided after this many is left alone.
MAX_WATCHED_STEPS = 2000


@register
class LossAtChance(Check):
    """
    ## What it does
    For classification losses (``cross_entropy``, ``nll_loss`` with integer class targets,
    mean reduction (or a sum, divided by the targets counted, as Hugging Face models compute
    it under ``Trainer``), no label smoothing or class weights, at most 1,000 classes) records, at
    every training step and on the loss's device (read on sampled steps), the loss, how many
    argmax predictions were right, and the class counts of the targets. After a burn-in of 20
    steps, it runs a sequential test over all the batches since: at looks spaced
    geometrically in the number of predictions, it asks whether the accuracy is significantly
    below the majority-class rate + 10 points (Chernoff's bound, α = 0.01 split over the
    looks) while the loss stays at the label prior's entropy H(y) (its 99% lower bound above
    95% of H(y), its mean below 1.25·ln C) and does not go down through H(y) (no Mann–Kendall
    decrease at z < −1.645 over the window with its last third below H(y): a correct model that
    learns slowly also sits near chance for a while, but its loss keeps falling past H(y)). It reports at the first look where all hold (at least 50 steps and 8
    batches after the burn-in), and stops watching once the accuracy is significantly above
    that bound, or after 2,000 steps. The decision is reported at the end of the run, unless
    the batches after it show the model learning (accuracy significantly above the bound): a
    correct model that sat on a plateau first is not reported; a model that memorises its
    random labels later is not either (a miss accepted to keep false alarms away).

    ## Why is this bad?
    A classifier stuck at H(y) has learned the class frequencies and nothing else: the
    labels are decoupled from the inputs. Typical causes: inputs and labels shuffled
    separately, the label column read from the wrong field, a dataset that returns the
    label of another index, augmentations applied to the image list but not the label
    list. Training runs to the end and looks stable; a large model may even memorise the
    random labels in later epochs, which the test does not wait for. L105 only looks at
    the first losses and L106 at the trend; this check names the level the loss is stuck at.

    On Keras 3 the same test runs on the batches of ``fit`` (each batch's loss, and its
    accuracy when the model is compiled with an accuracy metric, recovered from the running
    epoch means Keras logs), with the class counts of the ``y`` given to ``fit``; without an
    accuracy metric the loss alone decides, over at least 80 steps and 30 batches.

    ## Example
    ```python
    X = X[torch.randperm(len(X))]          # inputs shuffled ...
    y = y[torch.randperm(len(y))]          # ... and labels shuffled separately
    ```

    ## Use instead
    ```python
    perm = torch.randperm(len(X))
    X, y = X[perm], y[perm]                # one permutation for both
    ```
    A genuinely unlearnable task looks the same; so does a correct model that sits on a
    plateau at chance for more than ~50 steps after the burn-in before it starts to learn
    (measured: an embedding-bag text classifier with Adam 1e-3 stays at the prior for its
    whole first epoch of 96 steps, then learns) and a learning rate so low that nothing
    moves: the decision is made early on purpose, so such a run is reported too. M106 and
    L106 say more about those.

    ## References
    - Zhang et al., "Understanding deep learning requires rethinking generalization" (random labels), ICLR 2017: https://arxiv.org/abs/1611.03530
    - Karpathy, "A Recipe for Training Neural Networks" (verify loss @ init, input-independent baseline): https://karpathy.github.io/2019/04/25/recipe/
    - Wald, "Sequential Tests of Statistical Hypotheses", Annals of Mathematical Statistics 1945: https://doi.org/10.1214/aoms/1177731118
    """

    code = "L108"
    name = "loss-at-chance"
    severity = Severity.WARNING
    heuristic = True
    summary = "classification loss stays near ln(C) / the label prior: labels decoupled from inputs"
    fix = "check that inputs and labels are shuffled, split and indexed together (one permutation, one index)"

    def __init__(self, session) -> None:
        super().__init__(session)
        self._outcomes: list[BatchOutcome] = []
        self._classes = 0
        self._counts: torch.Tensor | None = None  # per-class target counts, on the loss's device
        self._rows: torch.Tensor | None = None  # (loss, correct, seen) of the steps not read yet
        self._steps: list[int] = []  # their steps
        self._location: Location | None = None
        self._last_step = -1
        self._decided = False
        self._found: dict | None = None  # an early decision, reported at the end unless the model learns after it

    def on_loss(self, event: LossComputed) -> None:
        if self._decided or event.step == self._last_step:
            return
        if event.step > MAX_WATCHED_STEPS:
            self._flush()
            self._decide(final=True)
            self._stop()
            return
        if event.function not in ("cross_entropy", "nll_loss") or not _plain_classification(event):
            return
        logits, target, output = event.input, event.target, event.output
        classes = int(logits.shape[1])
        if classes > MAX_CLASSES or (self._classes and classes != self._classes):
            return
        if self._rows is None or self._rows.device != output.device:
            self._flush()
            size = 4 * self.session.sample_every + self.session.full_window + 8
            self._rows = torch.zeros(size, 3, dtype=torch.float32, device=output.device)
            if self._counts is None or self._counts.device != output.device:
                counts = torch.zeros(classes, dtype=torch.float64, device=output.device)
                if self._counts is not None:
                    counts += self._counts.to(output.device)
                self._counts = counts
        if len(self._steps) >= self._rows.shape[0]:
            if event.sampled:
                self._flush()
            return  # full until the next sampled step reads it
        ignore = event.options.get("ignore_index", -100)
        counts_on_device = self._counts
        if counts_on_device is None:
            return
        with torch.no_grad():  # no host sync: every value stays on the device until a sampled step
            valid = (target != ignore) & (target >= 0) & (target < classes)
            safe = torch.where(valid, target, torch.zeros_like(target))
            correct = ((logits.detach().argmax(1) == safe) & valid).sum()
            row = self._rows[len(self._steps)]
            loss = output.detach().float().reshape(())
            if event.options.get("reduction", "mean") == "sum":  # Trainer's loss over the items of a batch
                loss = loss / valid.sum().clamp(min=1)
            row[0].copy_(loss)
            row[1].copy_(correct)
            row[2].copy_(valid.sum())
            counts_on_device.scatter_add_(0, safe.long(), valid.to(counts_on_device.dtype))
        self._last_step = event.step
        self._steps.append(event.step)
        if not self._classes:
            self._classes = classes
            self._location = event.location
        if event.sampled:
            self._flush()
            self._decide(final=False)

    def _flush(self) -> None:
        if self._rows is None or not self._steps:
            return
        values = self._rows[: len(self._steps)].tolist()  # the only sync, on sampled steps
        self._outcomes.extend(BatchOutcome(step, loss, int(correct), int(seen))
                              for step, (loss, correct, seen) in zip(self._steps, values, strict=True))
        self._steps.clear()

    def _decide(self, *, final: bool) -> None:
        if self._decided or self._counts is None:
            return
        if len(self.session.state.optimizers) > 1:
            return  # adversarial/multi-task training: losses at chance can be intended
        counts = self._counts.tolist()
        if self._found is None:
            self._found = at_chance(self._outcomes, counts)
            if self._found is None:
                if learning(self._outcomes, counts):
                    self._stop()  # the model beats the majority rate: nothing more to watch
                return
        found = self._found
        if not confirmed(self._outcomes, counts, found):
            self._stop()  # it learned after a plateau: no report
            return
        if not final:
            return
        self._stop()
        self.report(chance_sentence(found) + ".", location=self._location, evidence=found,
                    step=found["from_step"])

    def _stop(self) -> None:
        self.session.unsubscribe(self, "loss")  # decided: no per-step work left
        self._decided = True
        self._found = None
        self._rows = self._counts = None
        self._outcomes.clear()

    def on_run_end(self, event: RunEnd) -> None:
        self._flush()
        self._decide(final=True)
        self._stop()


def _plain_classification(event: LossComputed) -> bool:
    logits, target, output = event.input, event.target, event.output
    if not (has_plain_values(logits) and has_plain_values(target) and has_plain_values(output)):
        return False
    if logits.dim() != 2 or target.dim() != 1 or logits.shape[0] != target.shape[0] or logits.shape[1] < 2:
        return False
    if target.is_floating_point() or target.dtype == torch.bool or output.numel() != 1:
        return False
    if not output.requires_grad:
        return False  # evaluation, not training
    options = event.options
    if options.get("reduction", "mean") not in ("mean", "sum") or options.get("weight") is not None:
        return False
    return not options.get("label_smoothing")
