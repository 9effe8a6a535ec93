"""``--try loader``: the user's DataLoader rebuilt with other worker/pinning/prefetch settings,
each timed for a few seconds; the best few then timed end to end (loading, the copy to the
device and the user's training step on a copy of the model), which decides the advice.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from nndoctor.commands.perf.torch.step_trials import CapturedStep, StepRunner


def loader_grid(cpu_count: int, cuda: bool, current: dict[str, Any]) -> list[dict[str, Any]]:
    """num_workers 0, 2, 4, … and ¾ of the cores, up to the cores; pin_memory on CUDA."""
    workers = [0]
    n = 2
    while n < cpu_count:
        workers.append(n)
        n *= 2
    # Three quarters of the cores: with every core loading, the training process (its Python
    # thread, the pin-memory thread, the CUDA driver) has none left; measured on a 16-core
    # H200 host, 12 workers trained 1.2x faster end to end than 16 (benchmarks/README.md).
    if cpu_count * 3 // 4 > max(workers[-1], 2):
        workers.append(cpu_count * 3 // 4)
    if cpu_count > 1:
        workers.append(cpu_count)
    grid = []
    for w in dict.fromkeys(workers):
        for pin in ((False, True) if cuda else (False,)):
            grid.append({"num_workers": w, "pin_memory": pin, "prefetch_factor": 2 if w else None})
    current_key = {k: current.get(k) for k in ("num_workers", "pin_memory")}
    if not any(all(g[k] == v for k, v in current_key.items()) for g in grid):
        grid.insert(0, {**current_key, "prefetch_factor": current.get("prefetch_factor")})
    return grid


def _rebuild_loader(loader: Any, setting: dict[str, Any]) -> Any:
    import torch
    from torch.utils.data import BatchSampler, DataLoader, IterableDataset, SequentialSampler

    dataset = loader.dataset
    kwargs: dict[str, Any] = {
        "num_workers": setting["num_workers"],
        "pin_memory": setting["pin_memory"],
        "collate_fn": loader.collate_fn,
        "worker_init_fn": loader.worker_init_fn,
    }
    if setting["num_workers"]:
        kwargs["prefetch_factor"] = setting.get("prefetch_factor") or 2
        kwargs["persistent_workers"] = True  # epochs wrap inside one timing
    # Workers' seeds come from this generator: the same augmentations for every setting, and
    # no draw from the user's RNG.
    kwargs["generator"] = torch.Generator().manual_seed(0)
    if isinstance(dataset, IterableDataset):
        return DataLoader(dataset, batch_size=loader.batch_size, **kwargs)
    # A fixed order: the same samples for every setting.
    batch_size = loader.batch_size or 1
    sampler = BatchSampler(SequentialSampler(range(len(dataset))), batch_size,
                           drop_last=bool(getattr(loader, "drop_last", False)))
    return DataLoader(dataset, batch_sampler=sampler, **kwargs)


def _to_device(value: Any, device: str, non_blocking: bool) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return value.to(device, non_blocking=non_blocking)
    if isinstance(value, (list, tuple)):
        return type(value)(_to_device(v, device, non_blocking) for v in value)
    if isinstance(value, dict):
        return {k: _to_device(v, device, non_blocking) for k, v in value.items()}
    return value


def batches_per_epoch(loader: Any) -> int | None:
    try:
        return int(len(loader))
    except TypeError:  # an IterableDataset without __len__
        return None


class TimingWindow:
    """When to stop a throughput timing: after one whole epoch when that is affordable.

    At every epoch boundary the workers' prefetch pipeline runs dry and refills (one
    worker-batch of stall, ~0.7 s with 16 workers on ResNet-50 JPEGs); a window shorter than
    an epoch may or may not contain it, which moved the same setting's rate by ±10% between
    rounds. Exactly one epoch of consecutive batches contains exactly one boundary, as
    training does. So the window is one epoch when its projected length is at most
    ``EPOCH_STRETCH`` × ``seconds``; otherwise (long epochs, where the boundary's share is
    small anyway) ``fallback`` batches or ``seconds``, whichever ends first, after
    ``min_count``.
    """

    EPOCH_STRETCH = 4.0

    def __init__(self, per_epoch: int | None, seconds: float, fallback: int, min_count: int = 1) -> None:
        self.per_epoch = per_epoch if per_epoch and per_epoch >= min_count else None
        self.seconds, self.fallback, self.min_count = seconds, fallback, min_count
        self.whole_epoch = self.per_epoch is not None

    def done(self, count: int, elapsed: float) -> bool:
        per_epoch = self.per_epoch
        if self.whole_epoch and per_epoch is not None:  # whole_epoch is only ever set with per_epoch
            if count >= per_epoch:
                return True
            if elapsed >= self.seconds and count >= self.min_count:
                projected = elapsed * per_epoch / count
                if projected > self.EPOCH_STRETCH * self.seconds:
                    self.whole_epoch = False  # too long: fall back to the time box
                    return True
            return False
        return count >= self.fallback or (count >= self.min_count and elapsed >= self.seconds)

    @property
    def kind(self) -> str:
        return "one epoch" if self.whole_epoch else "time box"


def time_loader(loader: Any, setting: dict[str, Any], *, seconds: float, max_batches: int = 400,
                device: str | None = None) -> dict[str, Any]:
    """Steady-state samples/s of one loader setting, and the time to its first batch.

    With ``device`` ("cuda") each batch is also copied there (``non_blocking`` when pinned)
    and the copies are waited for at the end: pinned memory pays off in that copy, not in
    loading, so a loader-only timing would never recommend it.

    Worker processes fill ``num_workers * prefetch_factor`` batches ahead while the first
    one is being waited for; those are skipped before the clock starts, or the rate would
    count batches loaded during start-up. Epochs wrap (workers persist); the window is one
    epoch or a time box (``TimingWindow``).
    """
    from nndoctor.commands.perf.torch.recorder import _first_tensor

    setting = dict(setting)
    rebuilt = _rebuild_loader(loader, setting)
    ahead = setting["num_workers"] * (setting.get("prefetch_factor") or 2) if setting["num_workers"] else 0
    per_epoch = batches_per_epoch(rebuilt)
    window = TimingWindow(per_epoch if per_epoch and per_epoch <= max_batches else None, seconds, max_batches)
    started = time.perf_counter()
    first_s = t0 = None
    samples = batches = fetched = 0
    done = False
    while not done:
        count_before = fetched
        for batch in rebuilt:
            fetched += 1
            now = time.perf_counter()
            if first_s is None:
                first_s = now - started
            if fetched <= 1 + ahead:
                t0 = now
                continue
            if device is not None:
                _to_device(batch, device, bool(setting["pin_memory"]))
            tensor = _first_tensor(batch)
            samples += int(tensor.shape[0]) if tensor is not None and tensor.dim() else 1
            batches += 1
            assert t0 is not None  # set by the first fetches, which are not timed
            if window.done(batches, now - t0):
                done = True
                break
        if fetched == count_before:  # an empty loader
            break
    if device == "cuda":
        import torch

        torch.cuda.synchronize()
    elapsed = time.perf_counter() - t0 if t0 is not None else 0.0
    _shutdown(rebuilt)
    return {
        **setting,
        "samples_per_s": samples / elapsed if elapsed > 0 and samples else None,
        "batches": batches,
        "startup_s": first_s,
        "window": window.kind,
    }


def available_cpus() -> int:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def try_loader(loader: Any, current: dict[str, Any], *, cuda: bool, seconds: float = 2.0,
               cpu_count: int | None = None, step: CapturedStep | None = None, confirm_steps: int = 30,
               confirm_rounds: int = 2, step_variant: str = "baseline") -> dict[str, Any]:
    """Every setting of ``loader_grid``, then prefetch_factor 4 on the best one with workers;
    with ``step``, the top candidates of that grid timed end to end decide the advice.

    ``step_variant`` is the training step the loader will have to feed once the other advice
    is applied (e.g. ``"amp+channels_last"``): a faster step needs more loading, so the
    candidates are timed against that step, not the user's current one."""
    import torch

    if cpu_count is None:
        cpu_count = available_cpus()
    results = []
    device = "cuda" if cuda else None
    with torch.random.fork_rng(devices=[torch.cuda.current_device()] if cuda else []):
        for setting in loader_grid(cpu_count, cuda, current):
            results.append(time_loader(loader, setting, seconds=seconds, device=device))
        with_workers = [r for r in results if r["num_workers"] and r["samples_per_s"]]
        if with_workers:
            best = max(with_workers, key=lambda r: r["samples_per_s"])
            setting = {k: best[k] for k in ("num_workers", "pin_memory")} | {"prefetch_factor": 4}
            results.append(time_loader(loader, setting, seconds=seconds, device=device))
        summary = summarize_loader(results, current)
        if step is None or summary["best"] is None:
            return summary
        candidates = confirm_candidates(results, current)
        try:
            confirmed = confirm_end_to_end(loader, candidates, step, steps=confirm_steps, seconds=seconds,
                                           rounds=confirm_rounds, variant=step_variant)
        except Exception as error:  # noqa: BLE001 - keep the loader-alone advice, say why
            summary["confirm_error"] = f"{type(error).__name__}: {error}"
            return summary
    return summarize_confirmed(results, confirmed, current)


def _key(r: dict[str, Any]) -> tuple[int, bool]:
    return int(r["num_workers"]), bool(r["pin_memory"])


def _is_current(r: dict[str, Any], current: dict[str, Any]) -> bool:
    return r["num_workers"] == current.get("num_workers") and r["pin_memory"] == current.get("pin_memory")


def confirm_candidates(results: list[dict[str, Any]], current: dict[str, Any]) -> list[dict[str, Any]]:
    """The settings worth an end-to-end timing: the two best worker counts unpinned and the
    two best pinned (by the loader-alone rate, each with its fastest prefetch_factor), and
    the current one.

    Two per pinning, not one: alone, the loader has the cores to itself and the most workers
    win; in training the main process needs cores too, and the next worker count down can
    be the faster one (12 against 16 on a 16-core host)."""
    measured = [r for r in results if r.get("samples_per_s")]
    by_key: dict[tuple[int, bool], dict[str, Any]] = {}
    for r in sorted(measured, key=lambda r: -r["samples_per_s"]):
        by_key.setdefault(_key(r), r)  # the fastest prefetch_factor of each
    ranked = [r for r in by_key.values() if r["num_workers"]]
    chosen: list[dict[str, Any]] = []
    for pinned in (False, True):
        chosen += [r for r in ranked if bool(r["pin_memory"]) == pinned][:2]
    mine = next((r for r in measured if _is_current(r, current)), None)
    if mine is not None and all(_key(r) != _key(mine) for r in chosen):
        chosen.insert(0, mine)
    return [{k: r.get(k) for k in ("num_workers", "pin_memory", "prefetch_factor")}
            | {"loader_samples_per_s": r["samples_per_s"]} for r in chosen]


def _leaves(value: Any) -> list[Any]:
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [leaf for v in value for leaf in _leaves(v)]
    if isinstance(value, dict):
        return [leaf for v in value.values() for leaf in _leaves(v)]
    return []


def _replace_leaves(value: Any, pick: Callable) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return pick(value)
    if isinstance(value, (list, tuple)):
        return type(value)(_replace_leaves(v, pick) for v in value)
    if isinstance(value, dict):
        return {k: _replace_leaves(v, pick) for k, v in value.items()}
    return value


def step_batch(batch: Any, inputs: tuple, target: Any) -> tuple[tuple, Any] | None:
    """The tensors of a loader batch put where the captured step inputs and target were,
    matched by shape in order (cast to the captured dtype and memory format, as the user's
    loop must have done); None when some captured tensor has no match (a short last batch,
    a batch the loop reshapes): the caller then runs the step on the captured batch."""
    import torch

    pool = _leaves(batch)
    used: set[int] = set()

    def pick(like: Any) -> Any:
        for i, tensor in enumerate(pool):
            if i not in used and tuple(tensor.shape) == tuple(like.shape):
                used.add(i)
                tensor = tensor.to(device=like.device, dtype=like.dtype)
                if like.dim() == 4 and not like.is_contiguous() and like.is_contiguous(
                        memory_format=torch.channels_last):
                    tensor = tensor.contiguous(memory_format=torch.channels_last)
                return tensor
        raise LookupError

    try:
        return _replace_leaves(inputs, pick), _replace_leaves(target, pick)
    except LookupError:
        return None


def _shutdown(rebuilt: Any) -> None:
    shutdown = getattr(getattr(rebuilt, "_iterator", None), "_shutdown_workers", None)
    if shutdown is not None:
        shutdown()


def _cycle(rebuilt: Any):
    """Batches of the rebuilt loader, epoch after epoch (its workers persist)."""
    while True:
        empty = True
        for batch in rebuilt:
            empty = False
            yield batch
        if empty:
            return


def time_end_to_end(loader: Any, setting: dict[str, Any], runner: StepRunner, step: CapturedStep, *,
                    steps: int = 30, seconds: float = 2.0, warmup: int = 2,
                    min_steps: int = 5) -> dict[str, Any]:
    """Samples/s of the training loop with one loader setting: each batch is copied to the
    device (``non_blocking`` when pinned, as the tuning guide advises) and trained on with
    ``runner``. The batches the workers prefetched during start-up are drained first and
    ``warmup`` steps run; the clock then covers one epoch when that fits (``TimingWindow``),
    else ``steps`` steps or ``seconds`` once ``min_steps`` ran; the device is synchronised at
    both ends."""
    from nndoctor.commands.perf.torch.recorder import _first_tensor

    device = step.device
    non_blocking = bool(setting["pin_memory"]) and device == "cuda"
    rebuilt = _rebuild_loader(loader, setting)
    batches = _cycle(rebuilt)
    ahead = setting["num_workers"] * (setting.get("prefetch_factor") or 2) if setting["num_workers"] else 0
    window = TimingWindow(batches_per_epoch(rebuilt), seconds, steps, min_steps)
    mapped = {"loader": 0, "captured": 0}
    use_loader = True

    def train_on(batch: Any) -> int:
        nonlocal use_loader
        moved = _to_device(batch, device, non_blocking)
        pair = step_batch(moved, step.inputs, step.target) if use_loader else None
        if pair is not None:
            try:
                runner.run(*pair)
                mapped["loader"] += 1
                return _samples(batch)
            except Exception:  # noqa: BLE001 - the shapes matched but the model wants other tensors
                use_loader = False
                runner.optimizer.zero_grad(set_to_none=True)
        runner.run(step.inputs, step.target)
        mapped["captured"] += 1
        return _samples(batch)

    def _samples(batch: Any) -> int:
        tensor = _first_tensor(batch)
        return int(tensor.shape[0]) if tensor is not None and tensor.dim() else 1

    try:
        started = time.perf_counter()
        for _ in range(1 + ahead):
            if next(batches, None) is None:
                return {**setting, "samples_per_s": None, "steps": 0, "error": "the loader is empty"}
        startup_s = time.perf_counter() - started
        for _ in range(warmup):
            train_on(next(batches))
        mapped = {"loader": 0, "captured": 0}
        _sync(device)
        t0 = time.perf_counter()
        samples = done = 0
        while True:
            samples += train_on(next(batches))
            done += 1
            if window.done(done, time.perf_counter() - t0):
                break
        _sync(device)
        elapsed = time.perf_counter() - t0
    finally:
        batches.close()
        _shutdown(rebuilt)
    return {**setting, "samples": samples, "seconds": elapsed, "steps": done, "drain_s": startup_s,
            "window": window.kind,
            "batches_from_loader": mapped["loader"], "batches_captured": mapped["captured"]}


def confirm_end_to_end(loader: Any, candidates: list[dict[str, Any]], step: CapturedStep, *, steps: int = 30,
                       seconds: float = 2.0, rounds: int = 2, variant: str = "baseline") -> list[dict[str, Any]]:
    """Each candidate timed end to end ``rounds`` times, interleaved (forward, then backward
    order) so that drifting clocks and a warming machine hit every candidate alike; one copy
    of the model and optimizer serves them all. Rate: all samples over all measured time."""
    runner = StepRunner(variant, step.model, step.optimizer, step.loss_fn, step.inputs, step.target,
                        step.device)
    timings: list[list[dict[str, Any]]] = [[] for _ in candidates]
    for round_ in range(rounds):
        order = list(enumerate(candidates))
        for index, candidate in (order if round_ % 2 == 0 else order[::-1]):
            setting = {k: candidate[k] for k in ("num_workers", "pin_memory", "prefetch_factor")}
            timings[index].append(time_end_to_end(loader, setting, runner, step, steps=steps, seconds=seconds))
    confirmed = []
    for candidate, runs in zip(candidates, timings):
        samples = sum(r.get("samples", 0) for r in runs)
        elapsed = sum(r.get("seconds", 0.0) for r in runs)
        confirmed.append({
            **candidate,
            "samples_per_s": samples / elapsed if samples and elapsed > 0 else None,
            "rounds_samples_per_s": [r["samples"] / r["seconds"] if r.get("samples") and r.get("seconds") else None
                                     for r in runs],
            "steps": sum(r.get("steps", 0) for r in runs),
            "batches_from_loader": sum(r.get("batches_from_loader", 0) for r in runs),
            "batches_captured": sum(r.get("batches_captured", 0) for r in runs),
        })
    return confirmed


def confirm_step_variant(loader: Any, setting: dict[str, Any], step: CapturedStep, variant: str, *,
                         steps: int = 30, seconds: float = 2.0, rounds: int = 3) -> dict[str, Any]:
    """The user's step and ``variant`` (e.g. ``"amp+channels_last"``) timed end to end at one
    loader setting, interleaved ``rounds`` times: once the loader keeps up, does the faster step
    show in samples/s? (In an input-bound loop the variant's gain hides behind the data wait.)"""
    import statistics

    import torch

    setting = {k: setting[k] for k in ("num_workers", "pin_memory", "prefetch_factor")}
    runners = {name: StepRunner(name, step.model, step.optimizer, step.loss_fn, step.inputs, step.target,
                                step.device) for name in ("baseline", variant)}
    rates: dict[str, list[float]] = {name: [] for name in runners}
    with torch.random.fork_rng(devices=[torch.cuda.current_device()] if step.device == "cuda" else []):
        for round_ in range(rounds):
            order = list(runners.items())
            for name, runner in (order if round_ % 2 == 0 else order[::-1]):
                timing = time_end_to_end(loader, setting, runner, step, steps=steps, seconds=seconds)
                if timing.get("samples") and timing.get("seconds"):
                    rates[name].append(timing["samples"] / timing["seconds"])
    if not rates["baseline"] or not rates[variant]:
        return {"variant": variant, "setting": setting, "error": "no end-to-end timing"}
    base, faster = statistics.median(rates["baseline"]), statistics.median(rates[variant])
    spread = max((max(v) - min(v)) / statistics.median(v) for v in rates.values())
    return {"variant": variant, "setting": setting, "rounds": rounds, "baseline_samples_per_s": base,
            "variant_samples_per_s": faster, "rates": rates, "speedup": faster / base, "noise": spread,
            "pays_off": faster / base > 1.0 + max(spread, 0.03)}


def summarize_loader(results: list[dict[str, Any]], current: dict[str, Any]) -> dict[str, Any]:
    """Best setting, the current setting's rate, and the measured speed-up between them
    (loader alone: used when the training step could not be rebuilt)."""
    measured = [r for r in results if r.get("samples_per_s")]
    if not measured:
        return {"results": results, "best": None, "current": None, "speedup": None, "measure": "loader"}
    mine = next((r for r in measured if _is_current(r, current)), None)
    best = max(measured, key=lambda r: r["samples_per_s"])
    speedup = best["samples_per_s"] / mine["samples_per_s"] if mine else None
    return {"results": results, "best": best, "current": mine, "speedup": speedup, "measure": "loader"}


def summarize_confirmed(results: list[dict[str, Any]], confirmed: list[dict[str, Any]],
                        current: dict[str, Any]) -> dict[str, Any]:
    """The advice from the end-to-end timings; the loader-alone grid stays as evidence."""
    summary = summarize_loader(confirmed, current)
    summary["results"], summary["confirmed"], summary["measure"] = results, confirmed, "end-to-end"
    return summary


def _sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()
