"""The V family: install and driver problems, found by ``nndoctor env`` from what the driver,
the frameworks and the package metadata say — and, for the ones a crash message names
("Torch not compiled with CUDA enabled", "no kernel image is available"), by ``nndoctor
explain`` and crash reports too, which then point at ``nndoctor env``.

Each check is a pure function of ``EnvFacts`` (``diagnose``); the classes carry the catalog
entry and the documentation.
"""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from nndoctor.commands.explain.base import CrashExplanation, variant
from nndoctor.commands.explain.crash import Crash
from nndoctor.core.findings import Finding, Severity
from nndoctor.core.registry import Check, register

if TYPE_CHECKING:
    # Only ``nndoctor env`` reads these facts; ``nndoctor explain`` imports this module for its
    # crash explanations and should not pay for packaging, importlib.metadata and subprocess.
    from nndoctor.commands.env.frameworks import FrameworkFacts
    from nndoctor.commands.env.nvidia import DriverInfo
    from nndoctor.commands.env.packages import DuplicateInstall, UnmetRequirement
    from nndoctor.commands.env.tf_triton import TfTritonFacts

_GPU_FAILURE = re.compile(r"DNN|cuDNN|CUDA|GPU|convolution algorithm|cudart|cublas|cusolver|cufft|curand")
ENV_HINT = "Run `nndoctor env` to see the driver, the framework builds and the GPUs side by side."
# CUDA tags PyTorch publishes wheels for (https://pytorch.org/get-started/locally/), newest last.
TORCH_CUDA_TAGS = ((11, 8), (12, 1), (12, 4), (12, 6), (12, 8), (12, 9), (13, 0))
GPU_BUSY_MEMORY_FRACTION = 0.10
GPU_BUSY_UTILIZATION = 50.0


def _no_driver() -> DriverInfo:
    from nndoctor.commands.env.nvidia import DriverInfo

    return DriverInfo()


def _no_tf_triton() -> TfTritonFacts:
    from nndoctor.commands.env.tf_triton import TfTritonFacts

    return TfTritonFacts()


@dataclass
class EnvFacts:
    """Everything ``nndoctor env`` read, as plain data (the checks' only input)."""

    driver: DriverInfo = field(default_factory=_no_driver)
    frameworks: dict[str, FrameworkFacts] = field(default_factory=dict)
    companions: dict[str, str | None] = field(default_factory=dict)
    unmet: list[UnmetRequirement] = field(default_factory=list)
    duplicates: list[DuplicateInstall] = field(default_factory=list)
    environ: dict[str, str] = field(default_factory=dict)
    own_pids: frozenset[int] = frozenset()
    tf_triton: TfTritonFacts = field(default_factory=_no_tf_triton)


def _version_tuple(text: str | None) -> tuple[int, ...] | None:
    if not text:
        return None
    found = re.match(r"(\d+)\.(\d+)", text)
    return (int(found.group(1)), int(found.group(2))) if found else None


def _torch(facts: EnvFacts) -> FrameworkFacts | None:
    torch = facts.frameworks.get("torch")
    return torch if torch is not None and torch.importable else None


def _visible_env(environ: dict[str, str]) -> dict[str, str]:
    return {k: environ[k] for k in ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES") if k in environ}


def torch_install_command(torch_version: str, driver_cuda: str | None) -> str:
    """The pip command for the CUDA build of this torch release that the driver can run."""
    release = torch_version.split("+")[0]
    driver = _version_tuple(driver_cuda)
    usable = [tag for tag in TORCH_CUDA_TAGS if driver is None or tag <= driver]
    tag = usable[-1] if usable else TORCH_CUDA_TAGS[0]
    return (f"pip install --force-reinstall torch=={release} --index-url "
            f"https://download.pytorch.org/whl/cu{tag[0]}{tag[1]}")


def arch_supported(compute_capability: str, arch_list: list[str]) -> bool:
    """Can a build compiled for ``arch_list`` run on a GPU of ``compute_capability``?

    CUDA binaries (sm_XY) run on GPUs of the same major version and an equal or higher
    minor; PTX (compute_XY) is compiled by the driver for any GPU at least that new (NVIDIA,
    CUDA C++ Programming Guide, "Binary Compatibility" and "PTX Compatibility").
    """
    gpu = _version_tuple(compute_capability)
    if gpu is None or not arch_list:
        return True
    for arch in arch_list:
        found = re.fullmatch(r"(sm|compute)_(\d+)(\d)([af]?)", arch)
        if not found:
            continue
        kind, major, minor, suffix = found.group(1), int(found.group(2)), int(found.group(3)), found.group(4)
        if suffix == "a" and (major, minor) != gpu:
            continue  # arch-specific features (sm_90a) run on exactly that GPU
        if kind == "sm" and major == gpu[0] and minor <= gpu[1]:
            return True
        if kind == "compute" and (major, minor) <= gpu:
            return True
    return False


class EnvCheck(CrashExplanation):
    """Base of the V checks: env scope; those with ``patterns`` also explain crash messages."""

    scope: ClassVar[str] = "env"
    order: ClassVar[int] = 15  # install problems are specific: try them before generic explanations
    crash_message: ClassVar[str] = ""

    @classmethod
    def build(cls, crash: Crash, facts: dict[str, Any]) -> Finding:
        detail = cls.crash_message.format(**facts)
        return cls.make(crash, f"{detail} {ENV_HINT}", evidence={"error": crash.message[:300], **facts})


@register
class GpuNotVisible(EnvCheck):
    """
    ## What it does
    Reports GPUs that the NVIDIA driver lists (``nvidia-smi``) while the installed framework,
    built with CUDA, sees none — and crash messages saying no GPU is available.

    ## Why is this bad?
    Training silently runs on the CPU, tens of times slower, or fails on the first
    ``.cuda()``. The usual causes are an empty or wrong ``CUDA_VISIBLE_DEVICES`` (``""``,
    ``-1``, an index or UUID that does not exist), a container started without the GPU
    runtime (``--gpus all``), or a driver whose kernel module does not match the user-space
    library.

    ## Example
    ```bash
    CUDA_VISIBLE_DEVICES="" python train.py   # torch.cuda.is_available() is False
    ```

    ## Use instead
    ```bash
    CUDA_VISIBLE_DEVICES=0 python train.py    # or unset it; in Docker: docker run --gpus all …
    ```

    ## References
    - CUDA environment variables: https://docs.nvidia.com/cuda/cuda-c-programming-guide/index.html#env-vars
    - NVIDIA Container Toolkit, GPU enumeration: https://docs.nvidia.com/datacenter/cloud-native/container-toolkit/latest/docker-specialized.html
    """

    code = "V101"
    name = "gpu-not-visible"
    severity = Severity.ERROR
    summary = "the driver sees GPUs, the framework does not (CUDA_VISIBLE_DEVICES, container runtime)"
    fix = "unset or correct CUDA_VISIBLE_DEVICES; in a container start it with the GPU runtime (docker run --gpus all)"
    patterns = (r"RuntimeError: No CUDA GPUs are available", r"(?P<what>Found no NVIDIA driver on your system)")
    crash_message = "The framework found no usable GPU."


@register
class CpuOnlyBuild(EnvCheck):
    """
    ## What it does
    Reports a machine with an NVIDIA GPU whose installed PyTorch (or TensorFlow) build has no
    CUDA support, and the crash "Torch not compiled with CUDA enabled". It prints the exact
    ``pip`` command for the CUDA build of the same release that the driver can run.

    ## Why is this bad?
    ``pip install torch`` from some indexes, or a requirements file pinned to ``+cpu``,
    installs a CPU-only build: every ``.cuda()`` fails, or code that checks
    ``torch.cuda.is_available()`` trains on the CPU without a word.

    ## Example
    ```bash
    pip install torch --index-url https://download.pytorch.org/whl/cpu   # on a GPU machine
    ```

    ## Use instead
    ```bash
    pip install --force-reinstall torch==2.5.1 --index-url https://download.pytorch.org/whl/cu124
    ```

    ## References
    - PyTorch, Start locally (pick the CUDA build): https://pytorch.org/get-started/locally/
    - TensorFlow, pip install with GPU support: https://www.tensorflow.org/install/pip
    """

    code = "V102"
    name = "cpu-only-build"
    severity = Severity.ERROR
    summary = "a GPU is present but the installed framework build has no CUDA support"
    fix = "install the CUDA build of the framework (`nndoctor env` prints the exact pip command for your driver)"
    patterns = (r"(?P<what>Torch not compiled with CUDA enabled)",)
    crash_message = "This PyTorch build has no CUDA support ({what})."


@register
class DriverTooOld(EnvCheck):
    """
    ## What it does
    Compares the CUDA version the NVIDIA driver supports (``nvidia-smi``'s "CUDA Version")
    with the CUDA version the framework was built with, and explains "CUDA driver version
    is insufficient for CUDA runtime version" and "The NVIDIA driver on your system is too old".

    ## Why is this bad?
    A CUDA runtime newer than the driver's major version cannot start; within one major
    version, minor-version compatibility runs most code but not kernels that need
    just-in-time PTX compilation.

    ## Example
    ```text
    driver 535 (CUDA 12.2) with torch 2.9 built for CUDA 13.0
    ```

    ## Use instead
    Upgrade the driver, or install the framework build for the driver's CUDA version
    (``--index-url https://download.pytorch.org/whl/cu121``).

    ## References
    - NVIDIA, CUDA Compatibility (minor version compatibility): https://docs.nvidia.com/deploy/cuda-compatibility/
    - PyTorch, previous versions and CUDA builds: https://pytorch.org/get-started/previous-versions/
    """

    code = "V103"
    name = "driver-too-old"
    severity = Severity.ERROR
    summary = "the driver's CUDA version is below the framework build's"
    fix = "upgrade the NVIDIA driver, or install the framework build for the driver's CUDA version"
    patterns = (r"(?P<what>CUDA driver version is insufficient for CUDA runtime version)",
                r"(?P<what>The NVIDIA driver on your system is too old)")
    # cudaErrorInsufficientDriver's text, which TensorFlow's device start-up logs ("failed call to
    # cuInit: … CUDA driver version is insufficient …") and then carries on without the GPU.
    log_lines = (r"CUDA driver version is insufficient for CUDA runtime version",)
    preamble_evidence = False  # logged at start-up, then the framework runs on without the GPU
    crash_message = "The NVIDIA driver is older than the CUDA runtime this framework needs ({what})."


@register
class MissingCudaLibraries(EnvCheck):
    """
    ## What it does
    Reports CUDA libraries (libcudart, libcudnn, libcublas, libcupti, libcusolver …) that a
    framework could not load: TensorFlow's "Could not load dynamic library" and "Cannot dlopen
    some GPU libraries" lines, "DNN library is not found", and "lib….so: cannot open shared
    object file" import errors.

    ## Why is this bad?
    TensorFlow then silently trains on the CPU (it only logs the failed loads); PyTorch fails
    to import. The cause is a CUDA/cuDNN version that differs from the one the framework was
    built with, or libraries not on ``LD_LIBRARY_PATH``.

    ## Example
    ```text
    W tensorflow/stream_executor/platform/default/dso_loader.cc:64] Could not load dynamic library 'libcudnn.so.8'
    ```

    ## Use instead
    ```bash
    pip install 'tensorflow[and-cuda]'     # the CUDA libraries TensorFlow was built with, as wheels
    ```

    ## References
    - TensorFlow, tested build configurations: https://www.tensorflow.org/install/source#gpu
    - TensorFlow, pip install: https://www.tensorflow.org/install/pip
    """

    code = "V104"
    name = "missing-cuda-libraries"
    severity = Severity.ERROR
    summary = "libcudart/libcudnn/libcupti/libcusolver not loadable"
    fix = "install the CUDA/cuDNN versions the framework was built with (pip install 'tensorflow[and-cuda]', or the matching torch wheel)"
    patterns = (r"Could not load dynamic library '(?P<library>[^']+)'",
                r"(?P<library>lib(?:cu|nv|nccl)[\w.+-]*\.so[\w.]*): cannot open shared object file",
                r"(?P<library>DNN library) is not found",
                # cuDNN 9 looks for its sub-libraries by several names and prints them all.
                r"Unable to load any of \{(?P<library>libcudnn\w*\.so[\w.]*)")
    # cuDNN's own loader prints this and aborts the process (no Python exception):
    # "Could not load library libcudnn_ops_infer.so.8. Error: libcudnn_ops_infer.so.8: cannot open shared object file".
    log_lines = (r"Could not load library libcudnn\w*\.so[\w.]*\. Error: lib[\w.+-]+\.so[\w.]*: cannot open shared object file",
                 r"Unable to load any of \{libcudnn")
    crash_message = "A CUDA library could not be loaded: {library}."

    @classmethod
    def match(cls, crash: Crash) -> dict[str, Any] | None:
        facts = super().match(crash)
        if facts is None or any(re.search(p, f"{crash.exc_type}: {crash.message}", re.S) for p in cls.patterns):
            return facts
        if "DNN library is not found" in crash.text:
            return facts  # logged as the op's failure ("OP_REQUIRES failed … DNN library is not found")
        # Only TensorFlow's start-up warnings before the error name the library: they explain a
        # GPU or cuDNN failure, not an unrelated error that follows them in the same log.
        return facts if _GPU_FAILURE.search(crash.message) else None


@register
class IncompatiblePackages(EnvCheck):
    """
    ## What it does
    Lists installed packages whose declared requirements are not met — what ``pip check``
    reports, read from the packages' metadata — such as a torchvision built for another
    torch release, a TensorFlow with the wrong keras or protobuf, and frameworks that are
    installed but fail to import.

    ## Why is this bad?
    Mismatched pairs fail in confusing ways: ``operator torchvision::nms does not exist``,
    undefined symbols, protobuf "Descriptors cannot be created directly".

    ## Example
    ```bash
    pip install torch==2.5.1     # torchvision 0.19 (for torch 2.4) stays installed
    ```

    ## Use instead
    ```bash
    pip install torch==2.5.1 torchvision==0.20.1    # upgrade the pair together
    ```

    ## References
    - torchvision/torch version table: https://github.com/pytorch/vision#installation
    - pip check: https://pip.pypa.io/en/stable/cli/pip_check/
    """

    code = "V105"
    name = "incompatible-packages"
    severity = Severity.ERROR
    summary = "torch/torchvision pairs, tensorflow/keras/protobuf, any unmet requirement"
    fix = "install versions that satisfy each other's requirements (upgrade or downgrade the pair together)"
    patterns = (r"operator (?P<op>torchvision::\w+) does not exist",
                # torch.compile's inductor imports this from triton; a triton release other than the one
                # the torch wheel pins (pip install -U triton, or an old triton) lacks it.
                r"cannot import name '(?P<name>triton_key)' from '(?P<module>triton[\w.]*)'")
    crash_message = "torchvision does not match the installed torch ({op} is missing from this build)."

    @classmethod
    def build(cls, crash: Crash, facts: dict[str, Any]) -> Finding:
        if "name" in facts:
            message = (f"triton does not match the installed torch: torch.compile needs {facts['name']} from "
                       f"{facts['module']}, which this triton release does not have (torch wheels pin the "
                       f"triton they were built with). {ENV_HINT}")
            return cls.make(crash, message, evidence={"error": crash.message[:300], **facts},
                            fix="reinstall the triton version your torch pins (pip install --force-reinstall torch "
                                "pulls it), or upgrade torch and triton together")
        return super().build(crash, facts)


@register
class GpuBusy(Check):
    """
    ## What it does
    Reports other processes holding GPU memory (over 10% of a card) or a GPU already busy
    (utilization ≥ 50%) before training starts.

    ## Why is this bad?
    Training then shares the GPU: it runs out of memory at a batch size that fits an idle
    card, and its step time depends on someone else's job. Leftover processes of an
    interrupted run (DataLoader workers, a notebook kernel) are a common cause.

    ## Example
    ```text
    a notebook kernel from yesterday still holds 30 GiB on GPU 0
    ```

    ## Use instead
    Stop the listed processes, or pick an idle GPU with ``CUDA_VISIBLE_DEVICES``.

    ## References
    - nvidia-smi documentation: https://docs.nvidia.com/deploy/nvidia-smi/index.html
    """

    code = "V106"
    name = "gpu-busy"
    severity = Severity.WARNING
    scope = "env"
    summary = "GPU memory or compute taken by other processes"
    fix = "stop the listed processes, or choose an idle GPU with CUDA_VISIBLE_DEVICES"


@register
class ComputeCapabilityUnsupported(EnvCheck):
    """
    ## What it does
    Compares each GPU's compute capability with the architectures the installed PyTorch was
    compiled for (``torch.cuda.get_arch_list()``), and explains "no kernel image is available
    for execution on the device" and "CUDA capability sm_XX is not compatible with the
    current PyTorch installation" (PyTorch's start-up warning, also in a log that holds no
    error), naming the architectures the build supports.

    ## Why is this bad?
    A build without kernels for the GPU's architecture fails on the first CUDA operation
    (very new GPUs with an old build, or old GPUs dropped by a new build).

    ## Example
    ```text
    a GPU of compute capability 12.0 with a build for sm_50 … sm_90
    ```

    ## Use instead
    Install a build that lists the GPU's architecture (a newer CUDA tag for new GPUs, an
    older release for GPUs a release dropped).

    ## References
    - NVIDIA, CUDA C++ Programming Guide, compute capabilities and binary compatibility: https://docs.nvidia.com/cuda/cuda-c-programming-guide/index.html#binary-compatibility
    - PyTorch, Start locally: https://pytorch.org/get-started/locally/
    """

    code = "V107"
    name = "compute-capability-unsupported"
    severity = Severity.ERROR
    summary = "the GPU's architecture is not in the framework build"
    fix = "install a framework build compiled for this GPU's architecture"
    patterns = (r"(?P<what>no kernel image is available for execution on the device)",
                r"(?P<what>CUDA capability sm_\d+ is not compatible with the current PyTorch installation)"
                # The warning's next line lists the build's architectures.
                r"(?:\.?\s*The current PyTorch install supports CUDA capabilities (?P<supported>sm_\d+(?: \w+)*))?")
    # PyTorch's UserWarning at CUDA start-up (torch/cuda/__init__.py), on its own line after
    # "UserWarning:": "NVIDIA GeForce RTX 5090 with CUDA capability sm_120 is not compatible with
    # the current PyTorch installation." The program runs on until its first CUDA kernel.
    warning_lines = (r"with CUDA capability sm_\d+ is not compatible with the current PyTorch installation",)
    # The warning is printed at start-up: it explains "no kernel image is available", not
    # whatever exception comes later in the same log.
    preamble_evidence = False
    log_context_lines = 1
    crash_message = "This build has no kernels for the GPU ({what})."

    @classmethod
    def build(cls, crash: Crash, facts: dict[str, Any]) -> Finding:
        supported = f"; the build supports {facts['supported']}" if facts.get("supported") else ""
        detail = f"This build has no kernels for the GPU ({facts['what']}{supported})."
        return cls.make(crash, f"{detail} {ENV_HINT}", evidence={"error": crash.message[:300], **facts})


@register
class DuplicateOrMissingTools(Check):
    """
    ## What it does
    Reports a framework installed more than once on ``sys.path`` (two site-packages, a
    ``--user`` install beside a virtual environment, a conda and a pip copy), and TensorBoard
    missing where a framework that logs to it is installed.

    ## Why is this bad?
    Which copy ``import torch`` loads depends on path order, so ``pip install -U`` seems to do
    nothing, or the two copies' files mix. Without TensorBoard,
    ``torch.utils.tensorboard.SummaryWriter`` raises ImportError at the first log call.

    ## Example
    ```text
    torch 2.1.0 in ~/.local/lib/python3.11/site-packages and torch 2.5.1 in the venv
    ```

    ## Use instead
    ```bash
    pip uninstall torch   # repeat until none is left, then install once
    pip install tensorboard
    ```

    ## References
    - Python, the module search path: https://docs.python.org/3/library/sys_path_init.html
    - torch.utils.tensorboard: https://pytorch.org/docs/stable/tensorboard.html
    """

    code = "V108"
    name = "duplicate-or-missing-tools"
    severity = Severity.WARNING
    scope = "env"
    summary = "TensorBoard missing, several installations of one framework on sys.path"
    fix = "uninstall the extra copies so one installation remains; pip install tensorboard"


@variant
class TensorBoardNotInstalled(EnvCheck):
    """
    ## What it does
    From a crash: explains ``torch.utils.tensorboard`` failing to import because the
    ``tensorboard`` package is not installed in the environment that runs the script
    ("No module named 'tensorboard'", "TensorBoard logging requires TensorBoard with Python
    summary writer installed", "TensorBoard logging requires TensorBoard version 1.15 or
    above"). A traceback through a file of the user's named ``tensorboard.py`` is left alone:
    that file hides the package (E119's cause), and installing TensorBoard would not help.

    ## References
    - torch.utils.tensorboard (TensorBoard is installed separately): https://pytorch.org/docs/stable/tensorboard.html
    - bubbliiiing/yolov5-pytorch issue #115 (fixed by pip install tensorboard): https://github.com/bubbliiiing/yolov5-pytorch/issues/115
    """

    code = "V108"
    name = "duplicate-or-missing-tools"
    severity = Severity.WARNING
    summary = "TensorBoard missing, several installations of one framework on sys.path"
    fix = ("install TensorBoard in the environment that runs the script: python -m pip install tensorboard "
           "(with that environment's python)")
    patterns = (r"(?P<what>No module named 'tensorboard')",
                r"(?P<what>TensorBoard logging requires TensorBoard (?:with Python summary writer installed|version [\d.]+ or above))")
    crash_message = "TensorBoard is not installed in the Python environment that ran the script ({what})."

    @classmethod
    def match(cls, crash: Crash) -> dict[str, Any] | None:
        if any(re.split(r"[\\/]", frame.path)[-1] == "tensorboard.py" for frame in crash.frames):
            return None  # the user's tensorboard.py shadows the package: not a missing install
        own = f"{crash.exc_type}: {crash.message}"
        if not any(re.search(pattern, own) for pattern in cls.patterns):
            return None  # only the exception itself, not a line printed before it
        return super().match(crash)

    @classmethod
    def build(cls, crash: Crash, facts: dict[str, Any]) -> Finding:
        detail = cls.crash_message.format(**facts)
        message = (f"{detail} torch.utils.tensorboard needs the tensorboard package, which PyTorch does not install; "
                   "if it is installed, it is in another environment than the python that ran the script.")
        return cls.make(crash, message, evidence={"error": crash.message[:300], **facts})


@register
class TensorflowTritonCrash(Check):
    """
    ## What it does
    Reports TensorFlow 2.20 or newer (``tensorflow``, ``tensorflow-cpu``, ``tf-nightly``) and
    triton 3.7 or newer installed in the same environment, read from the package metadata;
    a TensorFlow wheel whose file list lacks ``tensorflow/python/pywrap_dlopen_global_flags.py``
    (built with the upstream fix) is not reported. When the pair is installed it runs ``import tensorflow; import triton`` once in a child
    process: an error if that child dies, a warning when the probe could not run, nothing
    when it exits cleanly. With ``KERAS_BACKEND=torch`` it also explains a TensorFlow import
    that kills the interpreter.

    ## Why is this bad?
    TensorFlow's PyPI wheels since 2.20 load ``_pywrap_tensorflow_internal.so`` with
    ``RTLD_GLOBAL``, which puts TensorFlow's statically linked LLVM in the process's global
    symbol table; triton 3.7's ``libtriton`` then binds its own LLVM calls to that copy and
    the interpreter dies with a segmentation fault while loading it, with no Python traceback.
    PyTorch imports triton lazily (through ``torch._dynamo`` at the first ``optimizer.step()``,
    or ``torch.compile``), so a PyTorch script that imported TensorFlow first (for ``tf.data``,
    TensorBoard, or Keras with the TensorFlow backend) crashes mid-training. With
    ``KERAS_BACKEND=torch``, ``import tensorflow`` itself crashes: TensorFlow imports Keras,
    which imports torch and its compiler stack.

    ## Example
    ```python
    import tensorflow as tf          # TensorFlow's LLVM is now global
    import torch
    dataset = tf.data.Dataset.from_tensor_slices(x).batch(32)
    optimizer = torch.optim.AdamW(model.parameters())
    optimizer.step()                 # imports triton: Segmentation fault (exit 139)
    ```

    ## Use instead
    ```python
    import triton                    # or: import torch._dynamo — before TensorFlow
    import tensorflow as tf
    import torch
    ```
    Or keep the TensorFlow part (data preparation, TensorBoard export) and the PyTorch
    training in separate environments or processes.

    ## References
    - TensorFlow issue #124205, TF >= 2.20 wheels load TF with RTLD_GLOBAL, segfaulting any later `import triton`: https://github.com/tensorflow/tensorflow/issues/124205
    - TensorFlow pull request #124230, omit the RTLD_GLOBAL helper from shared wheels: https://github.com/tensorflow/tensorflow/pull/124230
    - POT pull request #839, load triton before TensorFlow (the workaround): https://github.com/PythonOT/POT/pull/839
    """

    code = "V109"
    name = "tensorflow-triton-crash"
    severity = Severity.WARNING
    scope = "env"
    summary = "TensorFlow >= 2.20 and triton >= 3.7 installed together: importing triton after TensorFlow segfaults"
    fix = ("import triton (or torch._dynamo) before TensorFlow in the script, or keep TensorFlow and PyTorch "
           "training in separate environments or processes")


# -- decisions (pure functions of EnvFacts) -------------------------------------------------

FRAMEWORK_DISTRIBUTIONS = {"torch", "torchvision", "torchaudio", "tensorflow", "tensorflow-cpu", "keras",
                           "jax", "jaxlib", "numpy", "tensorboard", "transformers", "lightning"}


def gpu_visibility(facts: EnvFacts) -> list[Finding]:
    gpus = len(facts.driver.gpus)
    torch = _torch(facts)
    if not gpus or torch is None or not torch.facts.get("cuda_build") or torch.facts.get("device_count"):
        return []
    visible = _visible_env(facts.environ)
    reason = (f"CUDA_VISIBLE_DEVICES={visible['CUDA_VISIBLE_DEVICES']!r} hides them"
              if "CUDA_VISIBLE_DEVICES" in visible else
              (torch.facts.get("cuda_error") or "the CUDA runtime found no device"))
    message = (f"The NVIDIA driver lists {gpus} GPU(s) ({facts.driver.gpus[0].name}) but PyTorch "
               f"{torch.version} (built for CUDA {torch.facts['cuda_build']}) sees none: {reason}.")
    return [GpuNotVisible.finding(message, evidence={"driver_gpus": gpus, "torch_device_count": 0, **visible})]


def cpu_only_builds(facts: EnvFacts) -> list[Finding]:
    if not facts.driver.gpus:
        return []
    found = []
    torch = _torch(facts)
    if torch is not None and not torch.facts.get("cuda_build") and not torch.facts.get("hip_build"):
        command = torch_install_command(torch.version or "", facts.driver.cuda_version)
        found.append(CpuOnlyBuild.finding(
            f"This machine has {len(facts.driver.gpus)} NVIDIA GPU(s) ({facts.driver.gpus[0].name}, driver "
            f"{facts.driver.driver_version}, CUDA {facts.driver.cuda_version}) but PyTorch {torch.version} is a "
            f"CPU-only build: training will run on the CPU. Install the CUDA build: {command}",
            evidence={"torch": torch.version, "driver_cuda": facts.driver.cuda_version, "command": command},
            fix=command))
    tf = facts.frameworks.get("tensorflow")
    if tf is not None and tf.importable and not tf.facts.get("cuda_build"):
        found.append(CpuOnlyBuild.finding(
            f"This machine has NVIDIA GPU(s) but TensorFlow {tf.version} is a build without CUDA: "
            "install it with GPU support: pip install 'tensorflow[and-cuda]'",
            evidence={"tensorflow": tf.version}, fix="pip install 'tensorflow[and-cuda]'"))
    return found


def driver_versions(facts: EnvFacts) -> list[Finding]:
    driver = _version_tuple(facts.driver.cuda_version)
    torch = _torch(facts)
    build = _version_tuple(torch.facts.get("cuda_build")) if torch else None
    if torch is None or driver is None or build is None or build <= driver:
        return []
    same_major = build[0] == driver[0]
    message = (f"PyTorch {torch.version} was built for CUDA {torch.facts['cuda_build']} but the NVIDIA driver "
               f"{facts.driver.driver_version} supports CUDA {facts.driver.cuda_version}"
               + (": minor-version compatibility runs most kernels, but not those that need PTX compilation."
                  if same_major else ": CUDA cannot start with this driver."))
    command = torch_install_command(torch.version or "", facts.driver.cuda_version)
    return [DriverTooOld.finding(message, severity=Severity.WARNING if same_major else Severity.ERROR,
                                 evidence={"driver": facts.driver.driver_version, "driver_cuda": facts.driver.cuda_version,
                                           "build_cuda": torch.facts["cuda_build"]},
                                 fix=f"upgrade the NVIDIA driver, or install the build for the driver's CUDA: {command}")]


def missing_libraries(facts: EnvFacts) -> list[Finding]:
    found = []
    for framework in facts.frameworks.values():
        lines = list(framework.library_errors)
        if (framework.name == "torch" and framework.importable and facts.driver.gpus
                and framework.facts.get("cuda_available") and framework.facts.get("cudnn") is None):
            lines.append("torch.backends.cudnn.version() is None: cuDNN could not be loaded")
        if not lines:
            continue
        found.append(MissingCudaLibraries.finding(
            f"{framework.name} could not load {len(lines)} CUDA librar{'y' if len(lines) == 1 else 'ies'}: {lines[0]}"
            + (" (GPU training falls back to the CPU)" if framework.name == "tensorflow" else ""),
            evidence={"framework": framework.name, "lines": lines}))
    return found


def incompatible_packages(facts: EnvFacts) -> list[Finding]:
    found = []
    for unmet in facts.unmet:
        found.append(IncompatiblePackages.finding(
            unmet.describe(), evidence={"package": unmet.package, "version": unmet.package_version,
                                        "requires": unmet.requirement, "installed": unmet.installed},
            fix=f"pip install '{unmet.requirement}' (or a {unmet.package} release that matches what is installed)"))
    for framework in facts.frameworks.values():
        if framework.installed and not framework.importable and framework.import_error and not framework.library_errors:
            if framework.name == "tensorflow" and _tensorflow_import_killed(facts) is not None:
                continue  # V109 explains this crash
            found.append(_import_failure(framework, facts.environ))
    return found


def _import_failure(framework: FrameworkFacts, environ: dict[str, str]) -> Finding:
    """A framework that is installed but does not import: a warning (unused frameworks are
    often installed as someone else's dependency), with the specific fix where we know it."""
    error = framework.import_error or ""
    fix = None
    if framework.name == "keras" and "No module named 'tensorflow'" in error:
        backend = environ.get("KERAS_BACKEND")
        fix = ("Keras 3 uses the TensorFlow backend unless KERAS_BACKEND (or ~/.keras/keras.json) names another: "
               "export KERAS_BACKEND=torch (or jax), or pip install tensorflow")
        error += f" (KERAS_BACKEND={backend!r})" if backend else " (KERAS_BACKEND is not set)"
    return IncompatiblePackages.finding(
        f"{framework.name} is installed but fails to import: {error}", severity=Severity.WARNING,
        evidence={"framework": framework.name, "error": framework.import_error}, fix=fix)


def busy_gpus(facts: EnvFacts) -> list[Finding]:
    found = []
    for gpu in facts.driver.gpus:
        others = [p for p in facts.driver.processes if p.gpu_uuid == gpu.uuid and p.pid not in facts.own_pids]
        held = sum(p.used_memory_mib or 0 for p in others)
        heavy = gpu.memory_total_mib and held >= GPU_BUSY_MEMORY_FRACTION * gpu.memory_total_mib
        busy = (gpu.utilization_percent or 0) >= GPU_BUSY_UTILIZATION
        if not others or not (heavy or busy):
            continue
        listing = ", ".join(f"pid {p.pid} {p.name or '?'} {p.used_memory_mib or 0:.0f} MiB" for p in others[:5])
        total = f"{gpu.memory_total_mib / 1024:.1f}" if gpu.memory_total_mib is not None else "?"
        found.append(GpuBusy.finding(
            f"GPU {gpu.index} ({gpu.name}) is in use by {len(others)} other process(es) holding {held / 1024:.1f} GiB "
            f"of {total} GiB, utilization {gpu.utilization_percent or 0:.0f}%: {listing}",
            evidence={"gpu": gpu.index, "processes": [p.pid for p in others], "held_mib": held,
                      "utilization": gpu.utilization_percent}))
    return found


def unsupported_architectures(facts: EnvFacts) -> list[Finding]:
    torch = _torch(facts)
    if torch is None or not torch.facts.get("arch_list"):
        return []
    found = []
    for gpu in facts.driver.gpus:
        if gpu.compute_capability and not arch_supported(gpu.compute_capability, torch.facts["arch_list"]):
            found.append(ComputeCapabilityUnsupported.finding(
                f"GPU {gpu.index} ({gpu.name}) has compute capability {gpu.compute_capability} but PyTorch "
                f"{torch.version} was compiled for {' '.join(torch.facts['arch_list'])}: its kernels cannot run there.",
                evidence={"gpu": gpu.index, "compute_capability": gpu.compute_capability,
                          "arch_list": torch.facts["arch_list"]}))
    return found


def tools(facts: EnvFacts) -> list[Finding]:
    from packaging.utils import canonicalize_name

    found = []
    for duplicate in facts.duplicates:
        if canonicalize_name(duplicate.name) not in FRAMEWORK_DISTRIBUTIONS:
            continue
        places = "; ".join(f"{version} in {folder}" for version, folder in duplicate.locations)
        found.append(DuplicateOrMissingTools.finding(
            f"{duplicate.name} is installed {len(duplicate.locations)} times on sys.path ({places}); "
            "Python imports the first.", evidence={"package": duplicate.name, "locations": list(duplicate.locations)}))
    logs = [name for name in ("torch", "tensorflow") if facts.frameworks.get(name) and facts.frameworks[name].installed]
    if logs and facts.companions.get("tensorboard") is None:
        found.append(DuplicateOrMissingTools.finding(
            f"TensorBoard is not installed: {'torch.utils.tensorboard.SummaryWriter' if 'torch' in logs else 'tf.summary'}"
            " raises ImportError when the training script starts logging.",
            severity=Severity.INFO, evidence={"frameworks": logs}, fix="pip install tensorboard"))
    return found


def _exit_text(returncode: int | None) -> str:
    if returncode is not None and returncode < 0:
        try:
            return f"{signal.Signals(-returncode).name} (exit {returncode})"
        except ValueError:
            pass
    return f"exit {returncode}"


def _tensorflow_import_killed(facts: EnvFacts) -> str | None:
    """How ``import tensorflow`` alone died, when the TensorFlow/triton clash explains it: the
    pair is installed and KERAS_BACKEND=torch makes TensorFlow's Keras import torch's compiler
    stack, hence triton, after TensorFlow's library is loaded. None otherwise."""
    if not facts.tf_triton.at_risk or facts.environ.get("KERAS_BACKEND", "").strip().lower() != "torch":
        return None
    tf = facts.frameworks.get("tensorflow")
    if tf is not None and tf.import_error and "killed the interpreter" in tf.import_error:
        code = re.search(r"\(exit (-?\d+)\)", tf.import_error)
        return _exit_text(int(code.group(1)) if code else None)
    pair = facts.tf_triton
    if pair.probe_crashed and not pair.probe_tf_imported:
        return _exit_text(pair.probe_returncode)
    return None


def tensorflow_triton(facts: EnvFacts) -> list[Finding]:
    pair = facts.tf_triton
    if not pair.at_risk:
        return []
    versions = f"{pair.tf_distribution} {pair.tf_version} and triton {pair.triton_version} are installed together"
    wheel = (" (the TensorFlow wheel ships pywrap_dlopen_global_flags.py, so TensorFlow's LLVM is loaded "
             "with RTLD_GLOBAL)" if pair.global_flags_file else "")
    evidence = {**pair.to_json(), "keras_backend": facts.environ.get("KERAS_BACKEND")}
    killed = _tensorflow_import_killed(facts)
    if killed is not None:
        message = (f"{versions}{wheel}, and with KERAS_BACKEND=torch `import tensorflow` alone killed the "
                   f"interpreter with {killed}: TensorFlow imports Keras, "
                   "Keras imports torch and its compiler stack, which imports triton after TensorFlow's library "
                   "is loaded.")
        return [TensorflowTritonCrash.finding(message, severity=Severity.ERROR, evidence=evidence)]
    if pair.probe_crashed and pair.probe_tf_imported:
        message = (f"{versions}{wheel}: `import tensorflow; import triton` in a child process died with "
                   f"{_exit_text(pair.probe_returncode)} at `import triton`. torch imports triton at the first "
                   "optimizer.step() or torch.compile, so a script that imports TensorFlow first crashes there "
                   "without a traceback.")
        return [TensorflowTritonCrash.finding(message, severity=Severity.ERROR, evidence=evidence)]
    if pair.probe_returncode == 0:
        return []  # this build imports both in the crashing order: nothing to report
    if pair.probe_crashed:
        outcome = (f"the probe could not get past `import tensorflow` ({_exit_text(pair.probe_returncode)}), "
                   "so the crash was not confirmed")
    else:
        outcome = f"the crash was not confirmed ({pair.probe_error or 'no probe ran'})"
    message = (f"{versions}{wheel}: importing triton after TensorFlow segfaults with these releases "
               f"(tensorflow/tensorflow#124205); {outcome}. torch imports triton at the first optimizer.step() "
               "or torch.compile.")
    return [TensorflowTritonCrash.finding(message, evidence=evidence)]


DECISIONS = (gpu_visibility, cpu_only_builds, driver_versions, missing_libraries, incompatible_packages,
             busy_gpus, unsupported_architectures, tools, tensorflow_triton)


def diagnose(facts: EnvFacts) -> list[Finding]:
    findings: list[Finding] = []
    for decide in DECISIONS:
        findings.extend(decide(facts))
    return findings


ENV_CHECKS = (GpuNotVisible, CpuOnlyBuild, DriverTooOld, MissingCudaLibraries, IncompatiblePackages,
              GpuBusy, ComputeCapabilityUnsupported, DuplicateOrMissingTools, TensorflowTritonCrash)
