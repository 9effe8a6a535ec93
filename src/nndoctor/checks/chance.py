"""Classification that never leaves chance level: L108 loss-at-chance (the rule is
``nndoctor.core.rules.chance_level``, shared with Keras)."""

from __future__ import annotations

import operator

import torch

from nndoctor.checks._chance_ledger import BatchLedger
from nndoctor.core.events import BatchFetched, EpochStart, LossComputed, RunEnd
from nndoctor.core.findings import Location, Severity
from nndoctor.core.registry import Check, register
from nndoctor.core.rules.chance_level import (
    BatchOutcome,
    Evaluation,
    at_chance,
    chance_sentence,
    confirmed,
    learning,
    undecidable,
    with_held_out,
)
from nndoctor.instrument.loss_ledger import loss_ledger
from nndoctor.instrument.stats import has_plain_values

# Vocabulary-sized targets (language models) are left out: the per-step argmax over a
# vocabulary is not free, and next-token targets are no "labels" that can be shuffled.
MAX_CLASSES = 1000
# The test is about the first steps: a run still undecided after this many is left alone.
MAX_WATCHED_STEPS = 2000
# Evaluation steps waiting on the device for the next read (evaluations between two sampled steps).
MAX_PENDING_EVALUATIONS = 64


@register
class LossAtChance(Check):
    """
    ## What it does
    For classification losses (``cross_entropy``, ``nll_loss`` with integer class targets,
    mean reduction (or a sum, divided by the targets counted, as Hugging Face models compute
    it under ``Trainer``), no label smoothing or class weights, at most 1,000 classes) records, at
    every training step and on the loss's device (read on sampled steps), the loss, how many
    argmax predictions were right, the class counts of the targets, and which pass over the
    training data the batch came from (passes that trained, counted per dataset: a new
    ``DataLoader`` built every epoch over the same samples starts a new pass; an evaluation pass
    over the training set, or a batch peeked at before training, is none). It then runs a sequential test on the batches the model
    cannot have memorised yet (progressive validation: on a batch it has not been trained on, a
    model whose labels are independent of its inputs has an expected accuracy of at most the
    majority-class rate and an expected loss of at least the label prior's entropy H(y), whatever
    the model). With a ``DataLoader``, those are the batches of its first two passes (each sample
    trained on at most once before, many steps earlier; a burn-in of at most 20 steps, or a quarter
    of the first pass, is left out); without one (tensors sliced by hand), every batch after a
    20-step burn-in. At looks spaced geometrically in the number of predictions (and once more
    when the first two passes are over), it asks whether the accuracy is significantly below the
    majority-class rate + 10 points (the exact binomial tail, α = 0.01 split over the looks as
    α/(k(k+1))) while the loss stays at H(y) (its 99% lower bound above 95% of H(y), its mean
    below 1.25·ln C) and does not go down through H(y) (no Mann–Kendall decrease at z < −1.645
    over the window with its last third below H(y): a correct model that learns slowly also sits
    near chance for a while, but its loss keeps falling past H(y)). Without a ``DataLoader`` a
    look needs at least 50 steps and 8 batches after the burn-in; with one, the looks stop when
    the first two passes are over. It stops watching once the accuracy is significantly above
    that bound, or after 2,000 steps.

    The decision is reported at the end of the run unless the model is seen learning.
    Predictions on held-out data judge first (a classification loss computed without a
    gradient, as in ``Trainer``'s evaluation or a validation loop under ``torch.no_grad()`` /
    ``torch.inference_mode()``; summed per evaluation on the device): with labels independent of
    the inputs, held-out accuracy stays at most the majority rate whatever the model memorised,
    so the last evaluation, or all of them together, significantly above the majority rate
    (α = 0.05 split over the two) withdraws the report; the evaluations after the decision
    together significantly below the bound confirm it even when the training accuracy rises
    (the model memorising its random training labels in later epochs), and the message says so.
    Without a conclusive evaluation, the training batches after the decision judge: accuracy
    significantly above the bound, over all of them or over the last pass, withdraws the report
    (a correct model that sat on a plateau first; a model that memorises its random labels with
    no evaluation to tell it apart is withdrawn too: a miss accepted to keep false alarms away).

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
    epoch means Keras logs), with the class counts of the ``y`` given to ``fit``; its batches
    are judged as without a ``DataLoader`` (every batch after the burn-in); without an
    accuracy metric the loss alone decides, over at least 80 steps and 30 batches.

    ## Example
    ```python
    X = X[torch.randperm(len(X))]          # inputs shuffled ...
    y = y[torch.randperm(len(y))]          # ... and labels shuffled separately

    random.shuffle(texts)                  # a run_glue-style script: texts shuffled ...
    random.shuffle(labels)                 # ... and labels with another order
    Trainer(model=model, args=args, train_dataset=make_dataset(texts, labels)).train()
    ```

    ## Use instead
    ```python
    perm = torch.randperm(len(X))
    X, y = X[perm], y[perm]                # one permutation for both

    pairs = list(zip(texts, labels))
    random.shuffle(pairs)                  # shuffle the examples, not the columns
    texts, labels = map(list, zip(*pairs))
    ```
    A genuinely unlearnable task looks the same; so does a correct model that sits on a
    plateau at chance for its first two passes over a small dataset, or for more than ~50
    steps without a ``DataLoader``, and never leaves it within the run (one that learns later
    withdraws the report; measured: a tiny BERT under ``Trainer`` with the labels kept in
    place stays at the majority rate for its first pass of 16 steps, reaches 72% in its second
    and 98% in its third, and is not reported; an MLP on 256 samples trained with SGD at lr
    0.002 and no evaluation set, still at 54–61% training accuracy on a balanced binary task
    after 3–6 epochs, is reported, and with a validation pass after each epoch it is not), and a
    learning rate so low that nothing moves.
    M106 and L106 say more about those. Give the run an evaluation set
    (``eval_dataset``, a validation loop under ``torch.no_grad()``): held-out predictions are
    what tells a model that learns from one that memorises.

    ## References
    - Zhang et al., "Understanding deep learning requires rethinking generalization" (random labels), ICLR 2017: https://arxiv.org/abs/1611.03530
    - Karpathy, "A Recipe for Training Neural Networks" (verify loss @ init, input-independent baseline): https://karpathy.github.io/2019/04/25/recipe/
    - Arpit et al., "A Closer Look at Memorization in Deep Networks" (random labels are fit late, after patterns), ICML 2017: https://arxiv.org/abs/1706.05394
    - Blum, Kalai, Langford, "Beating the Hold-Out: Bounds for K-fold and Progressive Cross-Validation" (progressive validation), COLT 1999: https://www.ri.cmu.edu/publications/beating-the-holdout-bounds-for-kfold-and-progressive-cross-validation/
    - Dawid, "Present Position and Potential Developments: Some Personal Views: Statistical Theory: The Prequential Approach", JRSS A 1984: https://doi.org/10.2307/2981683
    - Wald, "Sequential Tests of Statistical Hypotheses", Annals of Mathematical Statistics 1945: https://doi.org/10.1214/aoms/1177731118
    - Hoeffding, "On the Distribution of the Number of Successes in Independent Trials" (the binomial tail bounds unequal success rates), Annals of Mathematical Statistics 1956: https://doi.org/10.1214/aoms/1177728178
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
        self._ledger: BatchLedger | None = None  # the training batches not read yet, on the device
        self._steps: list[tuple[int, int]] = []  # their steps, and the pass each batch came from
        self._settled = False  # the full ledger took its loss values (rare sampled steps)
        # Passes over the data (ids and counts only): the last pass started per dataset key, the
        # source of the last batch fetched, and the passes that trained per dataset key.
        self._serial = 0
        self._started: dict[object, int] = {}
        self._source: tuple[object, int] | None = None
        self._trained_serial: dict[object, int] = {}
        self._trained_passes: dict[object, int] = {}
        # Predictions on held-out data (losses without a gradient), per evaluation step, on the device
        # until the next read: [correct, seen, class counts...].
        self._pending_evaluations: dict[int, torch.Tensor] = {}
        self._evaluations: list[Evaluation] = []
        self._location: Location | None = None
        self._last_step = -1
        self._decided = False
        self._counts_read: list[float] | None = None  # the class counts, read with the ledger's rows
        self._found: dict | None = None  # an early decision, reported at the end unless the model learns after it

    def on_epoch_start(self, event: EpochStart) -> None:
        # A pass over some samples begins. Passes are counted per dataset, not per DataLoader (a
        # loop may build a new DataLoader every epoch over the same samples); only ids are kept.
        self._serial += 1
        key = _dataset_key(event.loader)
        self._started[key] = self._serial
        self._source = (key, self._serial)

    def on_batch(self, event: BatchFetched) -> None:
        # Where the next training batch comes from. An evaluation loader's batches set it too,
        # but their losses are not training losses. A DataLoader built in the ``for`` statement
        # is already gone: its batches come from the last pass started.
        if event.loader is not None:
            key = _dataset_key(event.loader)
            self._source = (key, self._started.get(key, -1))

    def _training_pass(self) -> int:
        """Which pass over its dataset the current training batch belongs to, counting only the
        passes that trained (an evaluation pass over the training set, or a batch peeked at
        before training, is no pass); -1 without a DataLoader."""
        if self._source is None:
            return -1
        key, serial = self._source
        if self._trained_serial.get(key) != serial:  # the first training batch of a new pass
            self._trained_serial[key] = serial
            self._trained_passes[key] = self._trained_passes.get(key, -1) + 1
        return self._trained_passes[key]

    def on_loss(self, event: LossComputed) -> None:
        if self._decided:
            return
        if event.step > MAX_WATCHED_STEPS:
            self._flush()
            self._decide(final=True)
            self._stop()
            return
        if event.function not in ("cross_entropy", "nll_loss") or not _plain_classification(event):
            return
        if not event.output.requires_grad:
            self._record_evaluation(event)
            return
        if event.step == self._last_step:
            return
        logits, target, output = event.input, event.target, event.output
        classes = int(logits.shape[1])
        if classes > MAX_CLASSES or (self._classes and classes != self._classes):
            return
        options = event.options  # ``in`` and a subscript, no .get calls (asked on every step)
        ignore = options["ignore_index"] if "ignore_index" in options else -100
        if type(ignore) is not int:
            try:  # cross_entropy / nll_loss take an int (or what converts to one: a NumPy integer)
                ignore = operator.index(ignore)
            except TypeError:
                return
        ledger = self._ledger
        if ledger is None or ledger.device != output.device:
            self._flush()
            # Sized for the default interval (100) at most: a very long NNDOCTOR_SAMPLE_EVERY would
            # otherwise ask the device for rows × batch × 16 bytes (the rows fill, then wait for the read).
            rows = 4 * min(self.session.sample_every, 100) + min(self.session.full_window, 64) + 8
            ledger = self._ledger = BatchLedger(rows, output.device, loss_ledger(self.session))
            if self._counts is None or self._counts.device != output.device:
                counts = torch.zeros(classes, dtype=torch.float64, device=output.device)
                if self._counts is not None:
                    counts += self._counts.to(output.device)
                self._counts = counts
        if len(self._steps) >= ledger.rows:
            if event.sampled:
                self._flush()
            elif not self._settled:
                ledger.settle()  # once per fill: the loss values, before the loss ledger drops them
                self._settled = True
            return  # full until the next sampled step reads it
        if self._counts is None:
            return
        self._counts_read = None  # record may add to the counts (a batch too wide to keep)
        ledger.record(logits, target, output, ignore, summed="reduction" in options and options["reduction"] == "sum",
                      counts=self._counts)
        self._last_step = event.step
        self._steps.append((event.step, self._training_pass() if self._source is not None else -1))
        if not self._classes:
            self._classes = classes
            self._location = event.location
        if event.sampled:
            self._flush()
            self._decide(final=False)

    def _record_evaluation(self, event: LossComputed) -> None:
        """A classification loss without a gradient: predictions on held-out data (an evaluation
        loop), which a model cannot have memorised. Summed per step on the device until the next read."""
        logits, target = event.input, event.target
        classes = self._classes
        if not classes or int(logits.shape[1]) != classes or self._counts is None:
            return  # before the first training step, or another head
        if event.step not in self._pending_evaluations and len(self._pending_evaluations) >= MAX_PENDING_EVALUATIONS:
            self._flush()
        ignore = event.options.get("ignore_index", -100)
        with torch.no_grad():
            valid = (target != ignore) & (target >= 0) & (target < classes)
            safe = torch.where(valid, target, torch.zeros_like(target))
            row = self._pending_evaluations.get(event.step)
            if row is None:
                with torch.inference_mode(False):  # a normal tensor, updatable in and out of inference mode
                    row = self._pending_evaluations[event.step] = torch.zeros(
                        2 + classes, dtype=torch.float64, device=logits.device)
            row[0] += ((logits.argmax(1) == safe) & valid).sum()
            row[1] += valid.sum()
            row[2:].scatter_add_(0, safe.long(), valid.to(row.dtype))

    def _flush(self) -> None:
        for step, row in self._pending_evaluations.items():
            values = row.tolist()
            evaluation = Evaluation(step, int(values[0]), int(values[1]), tuple(values[2:]))
            if self._evaluations and self._evaluations[-1].step == step:  # one evaluation read in two parts
                before = self._evaluations.pop()
                evaluation = Evaluation(step, before.correct + evaluation.correct, before.seen + evaluation.seen,
                                        tuple(a + b for a, b in zip(before.counts, evaluation.counts, strict=True)))
            self._evaluations.append(evaluation)
        self._pending_evaluations.clear()
        self._counts_read = None
        if self._ledger is None or not self._steps or self._counts is None:
            return
        values = self._ledger.read(self._classes, self._counts)  # the only sync, on sampled steps
        self._counts_read = self._ledger.counts_read  # read in the same copy: _decide's, right after
        self._outcomes.extend(BatchOutcome(step, loss, int(correct), int(seen), visit)
                              for (step, visit), (loss, correct, seen) in zip(self._steps, values, strict=True)
                              if loss is not None)  # None: dropped by the loss ledger (a run sampled very rarely)
        self._steps.clear()
        self._settled = False

    def _decide(self, *, final: bool) -> None:
        if self._decided or self._counts is None:
            return
        if len(self.session.state.optimizers) > 1:
            return  # adversarial/multi-task training: losses at chance can be intended
        counts, self._counts_read = self._counts_read, None
        if counts is None:  # nothing was read since the counts last changed
            counts = self._counts.tolist()
        if self._found is None:
            self._found = at_chance(self._outcomes, counts)
            if self._found is None:
                if learning(self._outcomes, counts) or undecidable(self._outcomes):
                    self._stop()  # the model beats the majority rate, or the judged passes are over
                return
        found = self._found
        if not confirmed(self._outcomes, counts, found, self._evaluations):
            self._stop()  # it learned after a plateau: no report
            return
        if not final:
            return
        found = with_held_out(found, self._evaluations)
        self._stop()
        self.report(chance_sentence(found) + ".", location=self._location, evidence=found,
                    step=found["from_step"])

    def _stop(self) -> None:
        self.session.unsubscribe(self, "loss", "batch", "epoch_start")  # decided: no per-step work left
        self._decided = True
        self._found = None
        self._ledger = self._counts = None
        self._outcomes.clear()
        self._evaluations.clear()
        self._pending_evaluations.clear()

    def on_run_end(self, event: RunEnd) -> None:
        self._flush()
        self._decide(final=True)
        self._stop()


def _dataset_key(loader: object) -> object:
    """Which samples a DataLoader goes over, as plain numbers: a TensorDataset by its tensors'
    memory (a new TensorDataset over the same tensors every epoch is the same data), any other
    dataset by its id."""
    dataset = getattr(loader, "dataset", None)
    if dataset is None:
        return id(loader)
    if isinstance(dataset, torch.utils.data.TensorDataset):
        return tuple((t.data_ptr(), tuple(t.shape)) for t in dataset.tensors)
    return id(dataset)


def _plain_classification(event: LossComputed) -> bool:
    logits, target, output = event.input, event.target, event.output
    tensor = torch.Tensor
    if type(logits) is tensor and type(target) is tensor and type(output) is tensor:
        # has_plain_values of the three, inlined (asked on every step): attributes, no calls
        strided = torch.strided
        for t in (logits, target, output):
            if t.layout != strided or t.is_nested or t.is_quantized or t.is_meta:
                return False
    elif not (has_plain_values(logits) and has_plain_values(target) and has_plain_values(output)):
        return False
    # Attributes, not methods (asked on every step): ndim for dim(), the dtype's flag for
    # is_floating_point(); a 0-d loss has one element without asking numel().
    if logits.ndim != 2 or target.ndim != 1 or logits.shape[0] != target.shape[0] or logits.shape[1] < 2:
        return False
    target_dtype = target.dtype
    if target_dtype.is_floating_point or target_dtype == torch.bool or (output.ndim and output.numel() != 1):
        return False
    options = event.options  # ``in`` and a subscript, no .get calls: a loss module passes all its options
    if ("reduction" in options and options["reduction"] not in ("mean", "sum")) \
            or ("weight" in options and options["weight"] is not None):
        return False
    return not ("label_smoothing" in options and options["label_smoothing"])
