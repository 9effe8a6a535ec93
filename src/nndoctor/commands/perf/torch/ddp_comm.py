"""DistributedDataParallel under ``nndoctor perf``: the all-reduce time of a step, how much of it
runs while the backward still computes, and the DDP settings of the user's model.

The communication comes from the same torch.profiler timeline as the kernel busy time
(``kernel_timeline.py``, the last warm-up steps):

- on CUDA (NCCL) the collectives are the ``nccl*`` kernels (``ncclKernel_AllReduce_…``,
  ``ncclDevKernel_…``) on DDP's communication stream; the computation is every other kernel;
- on CPU (gloo) the collectives are the ``gloo:all_reduce`` ranges the profiler records on
  gloo's worker threads; the computation is the autograd engine's backward functions, less the
  time the training thread itself spent inside ``c10d::`` calls (waiting to enqueue is not work).

*Overlapped* is the all-reduce time during which computation ran too (hidden behind the
backward); *exposed* is the rest — all-reduce time on the step's critical path, which a
faster or better-overlapped all-reduce can remove from the step.
"""

from __future__ import annotations

from typing import Any

from nndoctor.commands.perf.torch.kernel_timeline import Interval, merge


def _length(intervals: list[Interval]) -> float:
    return sum(b - a for a, b in intervals)


def _intersection(a: list[Interval], b: list[Interval]) -> list[Interval]:
    """Intersection of two merged, sorted interval lists."""
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if hi > lo:
            out.append((lo, hi))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def _minus(a: list[Interval], b: list[Interval]) -> list[Interval]:
    """``a`` without ``b`` (both merged and sorted)."""
    out: list[Interval] = []
    for lo, hi in a:
        cursor = lo
        for blo, bhi in b:
            if bhi <= cursor or blo >= hi:
                continue
            if blo > cursor:
                out.append((cursor, blo))
            cursor = max(cursor, bhi)
        if cursor < hi:
            out.append((cursor, hi))
    return out


def comm_breakdown(steps: list[Interval], comm: list[Interval], compute: list[Interval],
                   collectives: int, measure: str, drained: float | None = None) -> dict[str, Any] | None:
    """All-reduce seconds per step, the overlapped part and the exposed rest, from intervals
    (seconds). None when no step or no collective was seen. ``drained``: when the device finished
    the profiled steps' work (CUDA kernels run after the host's step ended: the last step's
    window reaches that far, while the fractions stay over the host's step time)."""
    steps = sorted(s for s in steps if s[1] > s[0])
    if not steps or not comm:
        return None
    comm_m, compute_m = merge(comm), merge(compute)
    wall = sum(b - a for a, b in steps)
    windows = merge(steps[:-1] + [(steps[-1][0], max(steps[-1][1], drained or 0.0))])
    in_steps = [piece for window in windows for piece in _intersection(comm_m, [window])]
    comm_s = _length(in_steps)
    overlapped_s = _length(_intersection(merge(in_steps), compute_m))
    exposed_s = max(0.0, comm_s - overlapped_s)
    n = len(steps)
    return {"steps": n, "all_reduce_s_per_step": comm_s / n, "overlapped_s_per_step": overlapped_s / n,
            "exposed_s_per_step": exposed_s / n,
            "overlapped_fraction": overlapped_s / comm_s if comm_s > 0 else None,
            "exposed_fraction_of_step": exposed_s / wall if wall > 0 else 0.0,
            "all_reduce_fraction_of_step": comm_s / wall if wall > 0 else 0.0,
            "collectives_per_step": collectives / n, "measure": measure}


def comm_from_events(events: Any, step_mark: str) -> dict[str, Any] | None:
    """``comm_breakdown`` from torch.profiler events (NCCL kernels when there are any, else gloo)."""
    from torch.autograd import DeviceType

    steps: list[Interval] = []
    nccl: list[Interval] = []
    kernels: list[Interval] = []
    gloo: list[Interval] = []
    backward: list[Interval] = []
    c10d: list[Interval] = []
    for event in events:
        span = (event.time_range.start / 1e6, event.time_range.end / 1e6)
        name = event.name
        if event.device_type == DeviceType.CUDA:
            (nccl if "nccl" in name.lower() else kernels).append(span)
        elif name.startswith(step_mark):
            steps.append(span)
        elif name.startswith("gloo:"):
            gloo.append(span)
        elif name.startswith("autograd::engine::evaluate_function"):
            backward.append(span)
        elif name.startswith("c10d::") or name.startswith("nccl:"):
            c10d.append(span)
    if nccl:
        drained = max(end for _, end in nccl + kernels)
        return comm_breakdown(steps, nccl, kernels, len(nccl), "torch.profiler: NCCL kernels vs the other kernels",
                              drained=drained)
    compute = _minus(merge(backward), merge(c10d))
    return comm_breakdown(steps, gloo, compute, len(gloo),
                          "torch.profiler: gloo collectives vs the backward's autograd functions")


def ddp_facts(module: Any) -> dict[str, Any] | None:
    """The DDP settings of a DistributedDataParallel module and its gradient size (plain values),
    or None for any other module or a process group of one."""
    try:
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel
    except ImportError:
        return None
    if not isinstance(module, DistributedDataParallel) or not dist.is_initialized():
        return None
    world = dist.get_world_size()
    grads = [p for p in module.parameters() if p.requires_grad]
    facts: dict[str, Any] = {
        "world_size": world, "backend": str(dist.get_backend()),
        "module": type(module.module).__name__,
        "gradient_as_bucket_view": bool(module.gradient_as_bucket_view),
        "static_graph": bool(module.static_graph),
        "find_unused_parameters": bool(module.find_unused_parameters),
        "bucket_cap_mb": module.bucket_bytes_cap / 2**20,
        "gradient_mb": sum(p.numel() * p.element_size() for p in grads) / 2**20,
        "parameters": len(grads),
        "no_sync_seen": False,
    }
    note_buckets(facts, module)
    return facts


def note_buckets(facts: dict[str, Any], module: Any) -> None:
    """DDP's own record of its buckets (rebuilt after the first backward: read again at the end
    of the window) and of a comm hook replacing the plain all-reduce."""
    try:
        logged = module._get_ddp_logging_data()
        facts["buckets"] = len([s for s in str(logged.get("bucket_sizes", "")).split(",") if s.strip()])
        facts["comm_hook"] = logged.get("comm_hook") or None
    except Exception:  # noqa: BLE001 - a private API: the facts go without it
        pass


def note_unused(facts: dict[str, Any], module: Any) -> None:
    """With find_unused_parameters=True, DDP records the bytes of parameters the last backward
    did not use: more than one value over the run means a graph that changes between steps
    (``static_graph=True`` would be wrong there)."""
    try:
        size = int(module._get_ddp_logging_data().get("unused_parameter_size", 0))
    except Exception:  # noqa: BLE001 - a private API
        return
    sizes = facts.setdefault("unused_parameter_sizes", [])
    if size not in sizes and len(sizes) < 8:
        sizes.append(size)


def bucket_cap_for(facts: dict[str, Any]) -> float:
    """The bucket_cap_mb ``--try ddp-bucket-cap`` measures: about half the gradients a bucket
    (two all-reduces: far fewer launches than 25 MB buckets on a large model, and the first
    still starts while the backward computes the rest), at least 50 MB, at most 200 MB."""
    return float(max(50, min(200, round(facts.get("gradient_mb", 0.0) / 2))))


def comm_lines(perf: dict[str, Any]) -> list[str]:
    """The communication part of the breakdown, as text."""
    ddp = perf.get("ddp")
    if not ddp:
        return []
    settings = (f"gradient_as_bucket_view={ddp['gradient_as_bucket_view']}, static_graph={ddp['static_graph']}, "
                f"bucket_cap_mb={ddp['bucket_cap_mb']:g}, find_unused_parameters={ddp['find_unused_parameters']}")
    buckets = ddp.get("buckets")
    lines = [f"DDP: {ddp['world_size']} ranks ({ddp['backend']}), {ddp['gradient_mb']:.1f} MB of gradients"
             + (f" in {buckets} bucket{'s' if buckets != 1 else ''}" if buckets else "") + f"; {settings}"]
    comm = perf.get("communication") or {}
    if comm.get("all_reduce_s_per_step") is not None:
        overlapped = comm.get("overlapped_fraction")
        lines.append(f"  all-reduce {1000 * comm['all_reduce_s_per_step']:.2f} ms a step "
                     f"({comm['all_reduce_fraction_of_step']:.0%} of the step, {comm['collectives_per_step']:.1f} "
                     f"collectives), {overlapped:.0%} overlapped with computation; exposed (on the critical path) "
                     f"{1000 * comm['exposed_s_per_step']:.2f} ms = {comm['exposed_fraction_of_step']:.0%} of the step "
                     f"({comm['steps']} warm-up steps, {comm['measure']})")
    elif comm.get("error") or comm.get("missing"):
        lines.append(f"  all-reduce: not measured ({comm.get('error') or comm.get('missing')})")
    if perf.get("ranks"):
        lines.append("  per rank (a rank's all-reduce includes waiting for the other ranks to reach it: "
                     "uneven times mean uneven work before it):")
    for rank in perf.get("ranks") or []:
        rank_comm = rank.get("communication") or {}
        comm_text = (f", all-reduce {1000 * rank_comm['all_reduce_s_per_step']:.2f} ms "
                     f"(exposed {1000 * rank_comm['exposed_s_per_step']:.2f} ms)"
                     if rank_comm.get("all_reduce_s_per_step") is not None else "")
        step = f"{1000 * rank['median_step_s']:.1f} ms" if rank.get("median_step_s") else "-"
        slowest = "  ← slowest" if rank.get("rank") == perf.get("slowest_rank") else ""
        lines.append(f"    rank {rank['rank']}: median step {step}{comm_text}{slowest}")
    return lines
