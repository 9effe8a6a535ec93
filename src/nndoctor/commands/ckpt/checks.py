"""Catalog entries for findings only ``nndoctor ckpt`` produces (C2xx).

C101, C103 and C104 are shared with runtime checks and built through shared_codes.py.
"""

from __future__ import annotations

from nndoctor.core.findings import Severity
from nndoctor.core.registry import Check, register


class CkptCheck(Check):
    scope = "ckpt"
    heuristic = False


@register
class StateDictKeyMismatch(CkptCheck):
    """Keys of a checkpoint and of the model (or second checkpoint) do not match.

    ## What it does
    Compares the parameter names of a checkpoint with those of a model built by
    `--model MODULE:CALLABLE` (or of a second checkpoint) and lists missing and unexpected
    keys, together with the mapping that would make them match: a prefix to strip or add,
    modules renamed with identical structure (`conv1.* → stem.*`).

    ## Why is this bad?
    `load_state_dict` raises `Missing key(s) … Unexpected key(s)`; the common "fix",
    `strict=False`, then loads nothing for the renamed layers and training silently starts
    from random weights.

    ## Example
    ```python
    model.load_state_dict(torch.load("old.pt"), strict=False)  # conv1.* vs stem.*: skipped
    ```

    ## Use instead
    ```console
    $ nndoctor ckpt diff old.pt --model models.py:build
    $ nndoctor ckpt fix old.pt -o fixed.safetensors --model models.py:build
    ```
    then `model.load_state_dict(load_file("fixed.safetensors"))` with `strict=True`.

    ## References
    - https://pytorch.org/docs/stable/generated/torch.nn.Module.html#torch.nn.Module.load_state_dict
    """

    code = "C201"
    name = "checkpoint-key-mismatch"
    severity = Severity.ERROR
    summary = "checkpoint and model keys differ (missing / unexpected), with the mapping that fixes it"
    fix = "apply the proposed mapping with 'nndoctor ckpt fix IN -o OUT --model MODULE:CALLABLE', then load with strict=True"


@register
class StateDictShapeMismatch(CkptCheck):
    """A key exists on both sides but its tensor shape differs.

    ## What it does
    Reports every parameter present in the checkpoint and the model under the same name
    (after the proposed mapping) whose shapes differ.

    ## Why is this bad?
    `load_state_dict` raises `size mismatch for …`. Workarounds that drop such keys
    silently leave those layers at their random initialisation.

    ## Example
    ```python
    # trained with Conv2d(3, 64, 7); the new model uses Conv2d(3, 64, 3)
    model.load_state_dict(ckpt)  # size mismatch for stem.weight
    ```

    ## Use instead
    Build the model with the architecture the checkpoint was trained with, or drop the
    mismatched keys explicitly (`nndoctor ckpt fix --drop REGEX`) and re-train those layers.

    ## References
    - https://pytorch.org/tutorials/beginner/saving_loading_models.html
    """

    code = "C202"
    name = "state-dict-shape-mismatch"
    severity = Severity.ERROR
    summary = "a parameter present on both sides has a different shape"
    fix = "build the model with the checkpoint's architecture, or drop those keys explicitly and re-train them"


@register
class ClassifierHeadChanged(CkptCheck):
    """The last layer differs only in its number of outputs: a head re-sized for new classes.

    ## What it does
    Among shape mismatches, recognises the final layer(s) whose shapes differ only in the
    first (output) dimension, e.g. `fc.weight [1000, 512] → [10, 512]`, and reports the class
    counts.

    ## Why is this bad?
    This is usually intended (fine-tuning on a new label set) but strict loading fails, and
    a careless `strict=False` also hides every other mismatch.

    ## Example
    ```python
    model = resnet18(num_classes=10)
    model.load_state_dict(torch.load("imagenet.pt"))  # size mismatch for fc.weight
    ```

    ## Use instead
    ```console
    $ nndoctor ckpt fix imagenet.pt -o backbone.pt --drop '^fc\\.'
    ```
    then `missing, unexpected = model.load_state_dict(sd, strict=False)` and assert that
    `missing` holds only the head's keys.

    ## References
    - https://pytorch.org/tutorials/beginner/finetuning_torchvision_models_tutorial.html
    """

    code = "C203"
    name = "classifier-head-changed"
    severity = Severity.WARNING
    summary = "the output layer's class count differs between checkpoint and model"
    fix = "drop the head's keys (fix --drop) and load the rest strictly; check that only the head is missing"


@register
class StateDictDtypeMismatch(CkptCheck):
    """Tensors whose dtype differs between checkpoint and model.

    ## What it does
    Lists keys whose dtype differs: half-precision checkpoints loaded into float32 models,
    and integer buffers stored as floats (BatchNorm's `num_batches_tracked`).

    ## Why is this bad?
    `load_state_dict` casts silently, so precision lost when the checkpoint was saved in
    float16 is never recovered; `num_batches_tracked` saved as float later fails with
    "result type Float can't be cast to the desired output type Long".

    ## Example
    ```python
    sd = {k: v.float() for k, v in model.state_dict().items()}  # num_batches_tracked too
    ```

    ## Use instead
    ```python
    sd = {k: v.float() if v.is_floating_point() else v for k, v in model.state_dict().items()}
    ```

    ## References
    - https://pytorch.org/docs/stable/generated/torch.nn.BatchNorm2d.html
    """

    code = "C204"
    name = "state-dict-dtype-mismatch"
    severity = Severity.WARNING
    summary = "a tensor's dtype differs between checkpoint and model (fp16 weights, float num_batches_tracked)"
    fix = "cast only floating-point tensors; keep integer buffers such as num_batches_tracked int64"


@register
class NormalizationEpsilonMismatch(CkptCheck):
    """A converted normalization layer uses a different epsilon than the source layer.

    ## What it does
    When converting Keras weights, compares each BatchNormalization / LayerNormalization
    `epsilon` with the `eps` of the PyTorch module that receives its weights.

    ## Why is this bad?
    Keras defaults to `epsilon=1e-3`, PyTorch to `eps=1e-5`. With small running variances
    the outputs differ noticeably, and the error compounds over many layers, so a "correct"
    conversion gives different predictions.

    ## Example
    ```python
    nn.BatchNorm2d(64)  # eps=1e-5, weights from keras BatchNormalization(epsilon=1e-3)
    ```

    ## Use instead
    ```python
    nn.BatchNorm2d(64, eps=1e-3, momentum=0.01)  # Keras momentum 0.99 == PyTorch 0.01
    ```

    ## References
    - https://keras.io/api/layers/normalization_layers/batch_normalization/
    - https://pytorch.org/docs/stable/generated/torch.nn.BatchNorm2d.html
    """

    code = "C205"
    name = "normalization-epsilon-mismatch"
    severity = Severity.WARNING
    summary = "converted BatchNorm/LayerNorm epsilon differs between Keras and PyTorch"
    fix = "construct the PyTorch layer with eps equal to the Keras epsilon"


@register
class ConversionOutputMismatch(CkptCheck):
    """After conversion, the PyTorch model's outputs differ from the Keras model's.

    ## What it does
    Runs the Keras model and the PyTorch model with the converted weights on the same
    random inputs and reports the maximum absolute difference when it exceeds the tolerance.

    ## Why is this bad?
    Every weight can have the right shape and the model still compute something else: a
    Dense kernel not transposed, a Flatten that orders features H,W,C in Keras and C,H,W in
    PyTorch, a GRU with `reset_after=False`, different padding.

    ## Example
    ```python
    torch_linear.weight.data = torch.from_numpy(keras_kernel.reshape(out, -1))  # no transpose
    ```

    ## Use instead
    ```console
    $ nndoctor ckpt convert model.keras -o model.safetensors --model net.py:build
    ```
    which transposes each layer type and verifies the outputs.

    ## References
    - https://keras.io/guides/serialization_and_saving/
    """

    code = "C206"
    name = "conversion-output-mismatch"
    severity = Severity.ERROR
    summary = "converted model's outputs differ from the Keras model's beyond tolerance"
    fix = "check padding, Flatten order and layer hyper-parameters of the PyTorch model against the Keras model"


@register
class UnconvertedWeights(CkptCheck):
    """Keras layers with weights that found no PyTorch module, or modules left unfilled.

    ## What it does
    Conversion pairs Keras layers and PyTorch modules by order within each layer type and
    checks their shapes. Layers of unsupported types, extra layers on either side, and
    shape disagreements are reported here.

    ## Why is this bad?
    A PyTorch parameter left at its initialisation makes the converted model silently wrong.

    ## Example
    ```python
    # Keras: Conv2D(32) → Conv2D(64) → Dense(10); PyTorch: Conv2d(3, 32) → Linear(…, 10)
    ```

    ## Use instead
    Give the PyTorch model the same layers, in the same order, as the Keras model.

    ## References
    - https://keras.io/api/layers/
    """

    code = "C207"
    name = "unconverted-weights"
    severity = Severity.ERROR
    summary = "Keras weights or PyTorch parameters left without a counterpart during conversion"
    fix = "make the PyTorch model's layers match the Keras model's layers type by type, in order"


@register
class ConversionNotVerified(CkptCheck):
    """The converted weights were not compared against the Keras model's outputs.

    ## What it does
    Reported when `convert` gets a weights-only Keras file and no `--keras-model`, or when
    Keras is not installed, so outputs could not be compared.

    ## Why is this bad?
    Shapes can match while the computation differs (Flatten order, padding, activations);
    only an output comparison shows that the conversion is right. A weights-only file also
    does not record a normalization layer's epsilon: Keras' `BatchNormalization` and
    `LayerNormalization` default to `epsilon=1e-3`, PyTorch's `BatchNorm2d`/`LayerNorm` to
    `eps=1e-5`, so a PyTorch model built with its defaults gives outputs off by about 5e-4
    (relative, for unit variance) with nothing in the file to say so. The message names
    those layers and the size of the effect computed from their stored moving variance.

    ## Example
    ```console
    $ nndoctor ckpt convert weights.weights.h5 -o w.pt --model net.py:build
    ```

    ## Use instead
    ```console
    $ nndoctor ckpt convert weights.weights.h5 -o w.pt --model net.py:build --keras-model kmodel.py:build
    ```

    ## References
    - https://keras.io/getting_started/#configuring-your-backend
    - https://keras.io/api/layers/normalization_layers/batch_normalization/ (epsilon defaults to 1e-3)
    - https://pytorch.org/docs/stable/generated/torch.nn.BatchNorm2d.html (eps defaults to 1e-5)
    """

    code = "C208"
    name = "conversion-not-verified"
    severity = Severity.WARNING
    summary = "converted weights not verified against the Keras model's outputs"
    fix = "give --keras-model MODULE:CALLABLE (or a full .keras file) so outputs can be compared"


@register
class NonfiniteWeights(CkptCheck):
    """The checkpoint contains NaN or Inf values.

    ## What it does
    Counts non-finite values in every floating-point tensor of the checkpoint.

    ## Why is this bad?
    A checkpoint saved after the loss diverged looks like any other file; resuming or
    fine-tuning from it produces NaN from the first step.

    ## Example
    ```python
    torch.save(model.state_dict(), "last.pt")  # saved after the loss became NaN
    ```

    ## Use instead
    Resume from an earlier checkpoint, and save only when the loss is finite
    (`if torch.isfinite(loss): torch.save(…)`).

    ## References
    - https://pytorch.org/docs/stable/generated/torch.isfinite.html
    """

    code = "C209"
    name = "nonfinite-weights"
    severity = Severity.ERROR
    summary = "NaN/Inf values stored in checkpoint tensors"
    fix = "resume from an earlier checkpoint; save only while the loss is finite"


@register
class MissingBatchNormCounter(CkptCheck):
    """Only BatchNorm `num_batches_tracked` buffers are missing: a checkpoint from before PyTorch 0.4.1.

    ## What it does
    Recognises missing keys that are all `*.num_batches_tracked`.

    ## Why is this bad?
    It is harmless for the weights, but strict loading of a plain dict (one without
    `_metadata`) fails, and people reach for `strict=False`, hiding real mismatches.

    ## Example
    ```python
    model.load_state_dict(old_sd)  # Missing key(s): "bn1.num_batches_tracked", …
    ```

    ## Use instead
    ```console
    $ nndoctor ckpt fix old.pt -o new.pt --model models.py:build
    ```
    which adds zero counters so the load is strict again.

    ## References
    - https://github.com/pytorch/pytorch/pull/13073
    """

    code = "C210"
    name = "missing-batchnorm-counter"
    severity = Severity.INFO
    summary = "only num_batches_tracked buffers are missing (old checkpoint): harmless, fixable"
    fix = "'nndoctor ckpt fix IN -o OUT --model …' adds the counters so the load is strict"
