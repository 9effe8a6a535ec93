"""Where nndoctor's per-step cost goes: unsampled steps vs sampled steps, timed one by one.

In one process (``nndoctor.watch()``, every check), a tiny MLP (64×32 → 32 → 10, Adam,
``loss.item()`` every step — the GPU overhead benchmark's loop, on CPU) is trained for
``--steps`` steps after the warm-up; each step is timed on the thread's CPU clock. Printed: the
median unsampled step, the mean sampled step, and what the sampled steps add to the average
step amortised over the interval (one in 100 after the first 16), against a plain run of the
same loop in the same process (medians of ``--rounds``, alternating order). Thread CPU time is
what other jobs on a shared machine inflate least.

    python benchmarks/step_split.py --rounds 3 --steps 3000
"""

from __future__ import annotations

import argparse
import statistics
import time


def train_timed(steps: int, warmup: int, doctored: bool) -> tuple[list[float], list[bool]]:
    import torch
    from torch import nn

    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(64, 32, generator=g), torch.randint(0, 10, (64,), generator=g)) for _ in range(8)]
    model = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 10))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    criterion = nn.CrossEntropyLoss()
    times: list[float] = []
    sampled: list[bool] = []
    session = None

    def loop() -> None:
        clock = time.thread_time
        for i in range(warmup + steps):
            x, y = batches[i % len(batches)]
            start = clock()
            optimizer.zero_grad()
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
            loss.item()
            if i >= warmup:
                times.append(clock() - start)
                # The step that just ran: session.step counts it already.
                sampled.append(session is not None and session.is_sampled(session.step - 1))

    if doctored:
        import nndoctor.integrations.api as api
        from nndoctor.core.engine import Session

        made: list[Session] = []
        original = api.Session

        def capture(*args, **kwargs):
            made.append(original(*args, **kwargs))
            return made[-1]

        api.Session = capture  # type: ignore[misc]
        try:
            with api.watch():
                session = made[0]
                loop()
        finally:
            api.Session = original  # type: ignore[misc]
    else:
        loop()
    return times, sampled


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    rows = []
    for r in range(args.rounds):
        order = (False, True) if r % 2 == 0 else (True, False)
        got = {doctored: train_timed(args.steps, args.warmup, doctored) for doctored in order}
        plain = statistics.median(got[False][0]) * 1e6
        times, sampled = got[True]
        unsampled = [t for t, s in zip(times, sampled, strict=True) if not s]
        picked = [t for t, s in zip(times, sampled, strict=True) if s]
        median_unsampled = statistics.median(unsampled) * 1e6
        mean_sampled = statistics.mean(picked) * 1e6 if picked else float("nan")
        amortised = (mean_sampled - median_unsampled) * len(picked) / len(times)
        rows.append((plain, median_unsampled, mean_sampled, amortised))
        print(f"round {r + 1}: plain {plain:.1f} µs; unsampled {median_unsampled:.1f} µs (+{median_unsampled - plain:.1f}); "
              f"{len(picked)} sampled steps, mean {mean_sampled:.0f} µs, amortised +{amortised:.1f} µs/step", flush=True)
    med = [statistics.median(col) for col in zip(*rows, strict=True)]
    print(f"median: plain {med[0]:.1f} µs/step; unsampled step +{med[1] - med[0]:.1f} µs; "
          f"sampled steps mean {med[2]:.0f} µs, amortised +{med[3]:.1f} µs/step")


if __name__ == "__main__":
    main()
