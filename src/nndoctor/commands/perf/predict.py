"""What each ``--try`` change can gain, predicted from the measured breakdown before anything is
re-run: the order of the trials (most promising first), the changes that cannot apply (skipped,
with the reason), and the bound shown for a change the budget left unmeasured.

Every number here is a *prediction* — an Amdahl bound: the part of the step a change acts on
(share ``s``, measured) made ``k`` times faster (``k`` a typical factor for that change, stated
in the text) gives at most ``1 / (1 - s + s / k)``. Nothing here is a measurement, and every
output says so (``"kind": "prediction"``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

FUSED_OPTIMIZERS = ("Adam", "AdamW", "SGD", "Adagrad")
# Above this GPU busy fraction kernel launches already hide behind running kernels.
BUSY_FOR_NO_GRAPHS = 0.90
# Below this data-wait fraction a faster loader cannot change the step time noticeably.
MIN_DATA_FRACTION = 0.05
# Changes whose re-run compiles first (more expensive than a plain re-run).
COMPILING = frozenset({"compile", "cuda-graphs", "sdpa"})


@dataclass
class PlanFacts:
    """The measured inputs of the predictions (plain values; built by ``plan_facts``)."""

    device: str = "cpu"
    capability: tuple[int, int] | None = None
    fractions: dict[str, float] = field(default_factory=dict)
    gpu_busy: float | None = None
    param_dtype: str = "float32"
    autocast: bool = False
    has_conv: bool = False
    cudnn_benchmark: bool = False
    input_shapes: int = 1
    optimizer_name: str = ""
    optimizer_fused: bool | None = None
    optimizer_foreach: bool | None = None
    attention: dict[str, Any] | None = None
    tf32_matmul: bool = False
    loader_batch_size: int | None = None
    # DistributedDataParallel (perf/torch/ddp_comm.py): settings and all-reduce time; None without DDP.
    ddp: dict[str, Any] | None = None
    communication: dict[str, Any] | None = None
    backwards_per_step: float | None = None

    @property
    def waiting(self) -> float:
        """Share of the step the loop waited for data, copies or I/O (grows with the batch)."""
        f = self.fractions
        return max(0.0, min(1.0, sum(f.get(name, 0.0) for name in ("data", "h2d", "io"))))

    @property
    def launch_idle(self) -> float:
        """Share of the step the GPU sat idle while the loop was *not* waiting for data or I/O:
        the time launches, host work and syncs leave the device without work, which CUDA graphs
        or a larger batch can fill (an input-bound GPU is idle too, but neither helps there)."""
        if self.gpu_busy is None:
            return 0.0
        return max(0.0, (1.0 - self.gpu_busy) - self.waiting)

    @property
    def compute_share(self) -> float:
        """Share of the step in forward, backward and the syncs that wait for them (on a GPU the
        host blocks in a sync while the device computes): all but data, copies, update and I/O."""
        f = self.fractions
        rest = sum(f.get(name, 0.0) for name in ("data", "h2d", "optimizer", "io"))
        return max(0.0, min(1.0, 1.0 - rest))


def amdahl(share: float, factor: float) -> float:
    """Speed-up of the whole step when ``share`` of it becomes ``factor`` times faster."""
    share = max(0.0, min(1.0, share))
    return 1.0 / (1.0 - share + share / max(factor, 1e-9))


def plan_facts(breakdown: Any, facts: Any, capability: tuple[int, int] | None) -> PlanFacts:
    """PlanFacts from the recorder's Breakdown and LoopFacts."""
    fractions = {name: breakdown.fraction(name) for name in breakdown.phases} if breakdown.steps else {}
    return PlanFacts(
        device=facts.device, capability=capability, fractions=fractions,
        gpu_busy=breakdown.gpu_busy_fraction, param_dtype=facts.param_dtype or "float32",
        autocast=facts.autocast, has_conv=facts.has_conv, cudnn_benchmark=facts.cudnn_benchmark,
        input_shapes=max(1, len(facts.input_shapes)), optimizer_name=facts.optimizer_name,
        optimizer_fused=facts.optimizer_fused, optimizer_foreach=facts.optimizer_foreach,
        attention=facts.attention, tf32_matmul=facts.tf32_matmul,
        loader_batch_size=((facts.loader_config or {}).get("batch_size")
                           or (facts.loader_config or {}).get("sampler_batch_size")),
        ddp=getattr(facts, "ddp", None), communication=getattr(facts, "communication", None),
        backwards_per_step=getattr(facts, "backwards_per_step", None),
    )


def _prediction(bound: float | None, basis: str) -> dict[str, Any]:
    return {"kind": "prediction", "bound": round(bound, 3) if bound is not None else None, "basis": basis}


def _skip(reason: str) -> dict[str, Any]:
    return {"kind": "prediction", "skip": reason}


def predict(change: str, f: PlanFacts) -> dict[str, Any]:
    """The prediction for one change: ``{"bound", "basis"}`` or ``{"skip": reason}``."""
    cuda = f.device == "cuda"
    c = f.compute_share
    if change == "fused-optimizer":
        return _fused_optimizer(f)
    if change.startswith("ddp-"):
        return predict_ddp(change, f)
    if change in ("amp", "tf32"):
        if f.param_dtype != "float32":
            return _skip(f"the parameters are {f.param_dtype} already, not float32")
        if f.autocast:
            return _skip("the forward runs under autocast already")
        if change == "tf32":
            if not cuda:
                return _skip(f"TF32 acts on CUDA devices only; this run trained on {f.device}")
            if not f.capability or f.capability < (8, 0):
                return _skip("TF32 needs compute capability 8.0 or newer (Ampere)")
            if f.tf32_matmul:
                return _skip("TF32 matmuls are allowed already (allow_tf32 / set_float32_matmul_precision)")
            return _prediction(amdahl(c, 3.0), f"forward and backward are {c:.0%} of the step; TF32 tensor "
                                               "cores typically run float32 matmuls up to 3× faster there")
        if cuda and f.capability and f.capability >= (7, 0):
            k = 2.0 if f.tf32_matmul else 6.0
            return _prediction(amdahl(c, k), f"float32 forward and backward are {c:.0%} of the step; bf16/fp16 "
                                             f"tensor cores typically make that part up to {k:g}× faster")
        return _prediction(amdahl(c, 1.5), f"forward and backward are {c:.0%} of the step; bf16 autocast on "
                                           f"{'a GPU without tensor cores' if cuda else 'a CPU'} gains up to ~1.5× there")
    if change == "sdpa":
        return _sdpa(f, c)
    if change == "compile":
        return _prediction(amdahl(c, 1.5), f"forward and backward are {c:.0%} of the step; torch.compile's fused "
                                           "kernels typically make them 1.1–1.5× faster (compiling costs a re-run's time)")
    if change == "cuda-graphs":
        if not cuda:
            return _skip(f"CUDA graphs need a CUDA device; this run trained on {f.device}")
        if f.gpu_busy is None:
            return _prediction(None, "the GPU's busy fraction was not measured")
        if f.gpu_busy >= BUSY_FOR_NO_GRAPHS:
            return _skip(f"the GPU was busy {f.gpu_busy:.0%} of the step: launches already hide behind "
                         "running kernels, so CUDA graphs have no launch time to remove")
        idle = f.launch_idle
        if idle < 1.0 - BUSY_FOR_NO_GRAPHS:
            return _skip(f"the GPU was idle {1 - f.gpu_busy:.0%} of the step, but {f.waiting:.0%} of the step "
                         "was the loop waiting for data or I/O: there is no launch time for CUDA graphs to remove")
        return _prediction(1.0 / (1.0 - idle), f"the GPU was idle {idle:.0%} of the step while not waiting for data: "
                                               "replaying the launches as one graph removes at most that")
    if change in ("channels_last", "cudnn-benchmark"):
        if not f.has_conv:
            return _skip(f"no convolution in the model: {change} acts on convolutions only")
        if change == "cudnn-benchmark":
            if not cuda:
                return _skip(f"cuDNN autotuning acts on CUDA devices only; this run trained on {f.device}")
            if f.cudnn_benchmark:
                return _skip("torch.backends.cudnn.benchmark is on already")
            if f.input_shapes > 1:
                return _skip(f"{f.input_shapes} input shapes in the window: autotuning would run again for each")
            return _prediction(amdahl(c, 1.3), f"convolutions are at most {c:.0%} of the step; autotuned cuDNN "
                                               "algorithms are typically up to 1.3× faster")
        return _prediction(amdahl(c, 1.3 if cuda else 1.2), f"convolutions are at most {c:.0%} of the step; NHWC "
                                                            "kernels are typically up to 1.2–1.3× faster")
    if change == "batch-size":
        if not f.loader_batch_size:
            return _skip("the batches do not come from a torch DataLoader/BatchSampler whose batch_size could "
                         "be changed (e.g. tensors made in the loop)")
        if cuda and f.gpu_busy is not None:
            # Loading, copying and I/O grow with the batch: per sample they stay what they are,
            # so only the rest of the step can get cheaper per sample (Amdahl over that rest).
            rest = max(0.0, 1.0 - f.waiting)
            if f.launch_idle >= 1.0 - BUSY_FOR_NO_GRAPHS:
                # Idle gaps between kernels mean small kernels: a K× batch runs nearly the same
                # launches on K× the samples, so that part's samples/s can grow up to K×.
                from nndoctor.commands.perf.rerun import BATCH_FACTORS

                top = max(BATCH_FACTORS["cuda"])
                waiting = (f" (the {f.waiting:.0%} spent waiting for data or I/O grows with the batch)"
                           if f.waiting >= MIN_DATA_FRACTION else "")
                return _prediction(amdahl(rest, top), f"the GPU was idle {f.launch_idle:.0%} of the step while not "
                                                      f"waiting for data (small kernels): a {top}× batch runs about "
                                                      f"the same launches on {top}× the samples{waiting}")
            return _prediction(1.0 / (1.0 - f.launch_idle), f"the GPU was busy {f.gpu_busy:.0%} of the step: a larger "
                                                            "batch can fill at most the idle time outside data waits "
                                                            "(samples/s)")
        return _prediction(None, "a larger batch's gain cannot be bounded from this breakdown")
    if change == "loader":
        data = f.fractions.get("data", 0.0)
        if data < MIN_DATA_FRACTION:
            return _skip(f"the loop waited for data {data:.1%} of the step: a faster loader gains at most "
                         f"{amdahl(data, 1e9):.2f}×")
        return _prediction(amdahl(data, 1e9), f"the loop waited for data {data:.0%} of the step (Amdahl bound)")
    return _prediction(None, "no model for this change")


NOT_DDP = ("the script does not train a DistributedDataParallel model with more than one rank "
           "(run it under torchrun: torchrun --nproc_per_node N -m nndoctor perf …)")


def predict_ddp(change: str, f: Any) -> dict[str, Any]:
    """The prediction of one DDP change from the breakdown's facts (``predict.PlanFacts``)."""
    ddp = f.ddp
    if not ddp or ddp.get("world_size", 1) < 2:
        return _skip(NOT_DDP)
    comm = f.communication or {}
    exposed = comm.get("exposed_fraction_of_step")
    if change == "ddp-bucket-view":
        if ddp["gradient_as_bucket_view"]:
            return _skip("gradient_as_bucket_view=True already")
        return _prediction(None, f"DDP copies the {ddp['gradient_mb']:.1f} MB of gradients into its all-reduce "
                                 "buckets and back every step; as views of the buckets they need neither copy nor "
                                 "the second copy's memory (gain not bounded from the breakdown)")
    if change == "ddp-static-graph":
        if ddp["static_graph"]:
            return _skip("static_graph=True already")
        unused = ddp.get("unused_parameter_sizes") or []
        if len(unused) > 1:
            return _skip(f"the graph changes between steps: the parameters a backward left unused varied "
                         f"({', '.join(f'{b / 2**20:.2f} MB' for b in sorted(unused))}); static_graph=True needs "
                         "the same parameters used every step")
        why = ("find_unused_parameters=True walks the autograd graph every step; with static_graph=True DDP "
               "does it once" if ddp["find_unused_parameters"] else
               "static_graph=True lets DDP fix the bucket order after the first step and skip per-step bookkeeping")
        return _prediction(None, f"{why}; it needs the same parameters used every step (the re-run fails "
                                 "otherwise, and says so)")
    if change == "ddp-bucket-cap":
        from nndoctor.commands.perf.torch.ddp_comm import bucket_cap_for

        cap = bucket_cap_for(ddp)
        if ddp["gradient_mb"] <= ddp["bucket_cap_mb"]:
            return _skip(f"the {ddp['gradient_mb']:.1f} MB of gradients fit in one bucket of "
                         f"bucket_cap_mb={ddp['bucket_cap_mb']:g} already: a larger cap changes nothing")
        if ddp["bucket_cap_mb"] >= cap:
            return _skip(f"bucket_cap_mb={ddp['bucket_cap_mb']:g} already (≥ the {cap:g} MB this would try)")
        prediction = _prediction(1.0 / max(1e-3, 1.0 - exposed) if exposed is not None else None,
                                 f"bucket_cap_mb={cap:g} ({ddp['gradient_mb']:.0f} MB of gradients, about half a "
                                 "bucket: fewer, larger all-reduces); "
                                 + (f"the exposed all-reduce is {exposed:.0%} of the step, at most all of it removed"
                                    if exposed is not None else "the all-reduce was not measured"))
        prediction["bucket_cap_mb"] = cap
        return prediction
    if change == "ddp-no-sync":
        k = f.backwards_per_step
        if ddp.get("no_sync_seen"):
            return _skip("the script accumulates under model.no_sync() already")
        if not k or k <= 1:
            return _skip("one backward per optimizer step: no gradient accumulation whose all-reduces "
                         "no_sync() could skip")
        if exposed is None:
            return _prediction(None, f"{k:g} backwards per optimizer step each all-reduce; no_sync() keeps one "
                                     "(the all-reduce was not measured)")
        share = exposed * (k - 1) / k
        return _prediction(1.0 / max(1e-3, 1.0 - share),
                           f"{k:g} backwards per optimizer step each all-reduce; no_sync() on all but the last "
                           f"removes {k - 1:g} of {k:g} all-reduces (exposed all-reduce {exposed:.0%} of the step)")
    return _prediction(None, "no model for this change")


def _fused_optimizer(f: PlanFacts) -> dict[str, Any]:
    if f.optimizer_name and f.optimizer_name not in FUSED_OPTIMIZERS:
        return _skip(f"{f.optimizer_name} has no fused kernels in torch (Adam, AdamW, SGD and Adagrad do)")
    if f.optimizer_fused:
        return _skip(f"{f.optimizer_name} runs fused kernels already (fused=True)")
    s = f.fractions.get("optimizer", 0.0)
    if f.optimizer_foreach is False or (f.device != "cuda" and not f.optimizer_foreach):
        how, k = "a loop over the parameters (foreach=False)", 4.0
    else:
        how, k = "foreach kernels", 2.0
    return _prediction(amdahl(s, k), f"the optimizer step is {s:.0%} of the step and runs {how}; fused kernels "
                                     f"typically make it up to {k:g}× faster")


def _sdpa(f: PlanFacts, c: float) -> dict[str, Any]:
    attention = f.attention
    if not attention or not attention.get("traced"):
        why = (attention or {}).get("error") or "no warm-up step to trace"
        return _prediction(None, f"the forward was not traced ({why})")
    if not attention.get("handwritten"):
        if attention.get("sdpa_calls"):
            return _skip(f"the attention uses F.scaled_dot_product_attention already "
                         f"({attention['sdpa_calls']} calls a forward)")
        return _skip("no hand-written attention (softmax(Q Kᵀ) V) in the traced forward")
    flops = attention.get("attention_flop_share") or 0.0
    # The scaling, mask and softmax read and write the T×T scores several times: memory-bound
    # work its FLOPs understate, so the part SDPA acts on is taken as three times its FLOP share.
    share = min(1.0, 3.0 * flops) * c
    names = attention.get("handwritten_modules") or []
    where = ", ".join(f"{name} ×{names.count(name)}" if names.count(name) > 1 else name for name in dict.fromkeys(names))
    return _prediction(amdahl(share, 3.0), f"hand-written attention in {where}"
                                           f" ({flops:.0%} of the forward's matmul FLOPs, with its T×T softmax and mask "
                                           f"taken as ~{share:.0%} of the step); fused attention typically makes that "
                                           "up to 3× faster")


def plan(changes: tuple[str, ...] | list[str], f: PlanFacts) -> tuple[list[str], dict[str, dict[str, Any]]]:
    """The changes to measure, most promising first, and every change's prediction (the
    skipped ones carry ``skip``). Ties go to the cheaper re-run (no compilation)."""
    predictions = {name: predict(name, f) for name in changes}
    runnable = [name for name in changes if "skip" not in predictions[name]]

    def promise(name: str) -> tuple[float, int]:
        bound = predictions[name].get("bound")
        return (-(bound if bound is not None else 1.01), 1 if name in COMPILING else 0)

    return sorted(runnable, key=promise), predictions


def prediction_text(prediction: dict[str, Any]) -> str:
    """One line for the report, always labelled a prediction."""
    if "skip" in prediction:
        return f"skipped: {prediction['skip']}"
    bound = prediction.get("bound")
    gain = f"up to {bound:.2f}×" if bound is not None else "gain not bounded"
    return f"predicted {gain} ({prediction['basis']}) — a prediction, not a measurement"
