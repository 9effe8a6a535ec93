"""Performance checks measured by ``nndoctor perf``: P101, P103–P106, P109 and P110.

Documentation and metadata only: they watch no event. ``diagnosis.diagnose`` reports them
from a finished ``PerfResult``, with the measured evidence and the gain that can be expected.
"""

from __future__ import annotations

from nndoctor.core.findings import Severity
from nndoctor.core.registry import Check, register


@register
class InputPipelineBound(Check):
    """
    ## What it does
    Times, over the measured window of `nndoctor perf`, how long the loop waits in
    `next(iter(loader))` and reports it when that is more than 20% of the step time, with
    the Amdahl bound on the speed-up that a loader that never makes the loop wait would give:
    `1 / (1 - fraction)`.

    ## Why is this bad?
    While the loop waits for data the GPU has nothing to do: "算力沒用滿 — feed input 的速度
    不夠快". No model-side change
    helps until the input pipeline keeps up.

    ## Example
    ```python
    loader = DataLoader(jpeg_folder, batch_size=128)        # decoding in the main process
    for images, labels in loader:                           # the GPU idles here
        ...
    ```

    ## Use instead
    ```python
    loader = DataLoader(jpeg_folder, batch_size=128, num_workers=8, pin_memory=True,
                        persistent_workers=True)
    ```
    `nndoctor perf --try loader` measures the settings on your dataset. The 20% threshold
    is the catalog's: below it even a perfect loader gains at most 1.25×. PyTorch's
    TensorBoard profiler plugin recommends worker processes from 5% of the step time in the
    DataLoader; nndoctor reports only what is worth a change on its own (≥ 1.25×) and
    leaves smaller waits to `--try loader`, which measures them.

    ## References
    - PyTorch performance tuning guide, "Enable async data loading and augmentation": https://pytorch.org/tutorials/recipes/recipes/tuning_guide.html
    - Holistic Trace Analysis, temporal breakdown: https://hta.readthedocs.io/
    - PyTorch Profiler TensorBoard plugin, its DataLoader recommendation (> 5% of the step): https://github.com/pytorch/kineto/blob/main/tb_plugin/torch_tb_profiler/profiler/run.py
    """

    code = "P101"
    name = "input-pipeline-bound"
    severity = Severity.WARNING
    summary = "the loop waits on data for >20% of step time"
    fix = "load batches in worker processes (num_workers>0, pin_memory=True); measure with --try loader"
    scope = "perf"
    heuristic = True


@register
class HostDeviceSync(Check):
    """
    ## What it does
    Counts, over the measured window, the calls that read a CUDA tensor back on the host —
    `.item()`, `.tolist()`, `.cpu()`, `.numpy()`, `.to("cpu")`, `float(t)`, `bool(t)`,
    `torch.cuda.synchronize()` — with the place in your code and the host time spent
    blocked in them. Reported at one or more per step.

    ## Why is this bad?
    The host waits until the GPU has finished everything queued before it, so it cannot
    queue the next step (or load the next batch) meanwhile; the GPU then idles while the
    host catches up. The estimated gain is the host's own work that could overlap the GPU,
    capped by the measured blocked time.

    ## Example
    ```python
    for x, y in loader:
        loss = criterion(model(x.cuda()), y.cuda())
        ...
        running += loss.item()            # a sync every step
    ```

    ## Use instead
    ```python
        running += loss.detach()          # stays on the GPU
        if step % 100 == 0:
            print(running.item() / 100)   # one sync every 100 steps
    ```

    ## References
    - PyTorch performance tuning guide, "Avoid unnecessary CPU-GPU synchronization": https://pytorch.org/tutorials/recipes/recipes/tuning_guide.html
    - `torch.cuda.set_sync_debug_mode`: https://pytorch.org/docs/stable/generated/torch.cuda.set_sync_debug_mode.html
    """

    code = "P103"
    name = "host-device-sync"
    severity = Severity.WARNING
    summary = "frequent host–device synchronizations per step"
    fix = "keep running metrics on the device (loss.detach()) and read them every N steps"
    scope = "perf"


@register
class GpuShared(Check):
    """
    ## What it does
    Lists, through NVML (nvidia-ml-py), the other compute processes on the GPU the run uses.

    ## Why is this bad?
    Several processes on the GPU share its compute, so everything is slower; their memory also leaves less for yours.
    No threshold: any other process is reported with its memory.

    ## Example
    ```
    $ nvidia-smi      # a forgotten notebook kernel still holds the GPU
    ```

    ## Use instead
    Stop the other process, or pick a free GPU with `CUDA_VISIBLE_DEVICES`.

    ## References
    - NVML `nvmlDeviceGetComputeRunningProcesses`: https://docs.nvidia.com/deploy/nvml-api/
    """

    code = "P104"
    name = "gpu-shared"
    severity = Severity.WARNING
    summary = "other processes use the same GPU"
    fix = "stop the other processes or choose a free GPU (CUDA_VISIBLE_DEVICES)"
    scope = "perf"


@register
class NoMixedPrecision(Check):
    """
    ## What it does
    Training in float32 without autocast on a GPU with tensor cores (compute capability
    7.0 or newer). With `--try amp` it times the step under
    `torch.autocast("cuda", dtype=torch.bfloat16)` against the baseline (interleaved
    repeats) and checks that the loss on the same batch moves less than 5%; a measured gain
    makes it a warning, no gain removes it. On Keras/TensorFlow (a GPU with a float32 dtype
    policy) `--try mixed-precision` (or `amp`) re-runs the script with
    `keras.mixed_precision.set_global_policy("mixed_float16")` set before the model is built,
    and compares the loss after the window the same way.

    ## Why is this bad?
    Tensor cores run bf16/fp16 matrix products many times faster than fp32, and half the
    bytes move through memory; leaving them idle is usually the largest single waste in a
    convolutional or transformer step.

    ## Example
    ```python
    loss = criterion(model(x), y)
    ```

    ## Use instead
    ```python
    with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
        loss = criterion(model(x), y)
    ```
    Keras: `keras.mixed_precision.set_global_policy("mixed_float16")` before building the model
    (`fit` then scales the loss; a custom loop wraps its optimizer in `LossScaleOptimizer`).

    ## References
    - PyTorch AMP recipe: https://pytorch.org/tutorials/recipes/recipes/amp_recipe.html
    - NVIDIA DeepLearningExamples ResNet-50 (AMP on A100: 2,470 images/s): https://github.com/NVIDIA/DeepLearningExamples
    - Keras mixed precision (dtype policies, loss scaling): https://keras.io/api/mixed_precision/
    """

    code = "P105"
    name = "no-mixed-precision"
    severity = Severity.WARNING
    summary = "fp32 training on a tensor-core GPU"
    fix = "wrap forward and loss in torch.autocast(device_type='cuda', dtype=torch.bfloat16)"
    scope = "perf"


@register
class MemoryFormat(Check):
    """
    ## What it does
    A network with convolutions trained on the GPU on NCHW (`contiguous_format`) input.
    With `--try channels_last` it times the step with model and input in
    `torch.channels_last` and reports only a measured gain.

    ## Why is this bad?
    cuDNN's tensor-core convolution kernels work in NHWC; given NCHW they transpose inputs
    and outputs around every convolution. The seed's advice ("data_format 改用 channel_first
    (cuDNN)") was for TensorFlow's NHWC default on pre-tensor-core cards; on
    current cards with mixed precision it is the other way round — which is why this check
    asks for a measurement before it advises.

    ## Example
    ```python
    model = torchvision.models.resnet50().cuda()
    out = model(images.cuda())
    ```

    ## Use instead
    ```python
    model = model.to(memory_format=torch.channels_last)
    out = model(images.cuda().to(memory_format=torch.channels_last))
    ```

    ## References
    - PyTorch channels-last tutorial: https://pytorch.org/tutorials/intermediate/memory_format_tutorial.html
    """

    code = "P106"
    name = "memory-format"
    severity = Severity.WARNING
    summary = "conv net on GPU in NCHW where channels_last is faster"
    fix = "model.to(memory_format=torch.channels_last) and the same for the input batch"
    scope = "perf"


@register
class LowGpuUtilization(Check):
    """
    ## What it does
    Records CUDA events at the start of each measured step's first forward and after its
    optimizer step, and reports when that GPU span is under half of the step's wall time.
    The span includes gaps between kernels, so it is an upper bound on the busy time: a
    finding is conservative.

    ## Why is this bad?
    The GPU idles for the rest of the step — waiting for data, for the host to launch work,
    for syncs or I/O. The bound on the
    gain is `1 / busy fraction` if the idle time disappeared.

    ## Example
    ```python
    for x, y in loader:              # 60% of the step waiting for the loader
        train_step(x.cuda(), y.cuda())
    ```

    ## Use instead
    Fix what the breakdown shows first (P101/P102 data, P103 syncs, C105 checkpoints);
    for launch-bound small models, larger batches, `torch.compile` or CUDA graphs.

    ## References
    - Holistic Trace Analysis, idle time breakdown: https://hta.readthedocs.io/
    """

    code = "P109"
    name = "low-gpu-utilization"
    severity = Severity.WARNING
    summary = "GPU busy for under half the wall time"
    fix = "remove what the GPU waits for (see the breakdown: data, syncs, I/O); then grow the batch or compile"
    scope = "perf"


@register
class CudnnBenchmarkOff(Check):
    """
    ## What it does
    A conv network on CUDA fed one input shape for the whole measured window while
    `torch.backends.cudnn.benchmark` is False. With `--try cudnn-benchmark` the step is
    timed with it on; only a measured gain is advised.

    ## Why is this bad?
    With benchmark off cuDNN picks convolution algorithms by heuristic; with it on it times
    the candidates once per shape and keeps the fastest — free speed when shapes do not
    change (and a cost when they change every step, hence the single-shape condition).

    ## Example
    ```python
    model = resnet50().cuda()        # 224×224 crops, batch 128, every step
    ```

    ## Use instead
    ```python
    torch.backends.cudnn.benchmark = True
    ```

    ## References
    - PyTorch performance tuning guide, "Enable cuDNN auto-tuner": https://pytorch.org/tutorials/recipes/recipes/tuning_guide.html
    """

    code = "P110"
    name = "cudnn-benchmark-off"
    severity = Severity.INFO
    summary = "fixed input shapes with cudnn.benchmark off"
    fix = "torch.backends.cudnn.benchmark = True (input shapes are fixed)"
    scope = "perf"
