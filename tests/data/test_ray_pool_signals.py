"""``RayPool`` gives back the SIGTERM handler ``ray.init`` replaces (it calls ``sys.exit(15)``,
and every child forked afterwards would inherit it)."""

from __future__ import annotations

import signal
import sys
import types

from nndoctor.commands.data import ray_engine


def _fake_ray() -> types.SimpleNamespace:
    state = {"up": False}

    def init(**kwargs):
        state["up"] = True
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(signum))  # what ray.init does

    def shutdown():
        state["up"] = False

    context = types.SimpleNamespace(enable_progress_bars=True, print_on_execution_start=True)
    return types.SimpleNamespace(
        is_initialized=lambda: state["up"], init=init, shutdown=shutdown,
        cluster_resources=lambda: {"CPU": 2.0},
        data=types.SimpleNamespace(DataContext=types.SimpleNamespace(get_current=lambda: context)))


def test_an_owned_ray_gives_the_sigterm_handler_back(monkeypatch):
    fake = _fake_ray()
    monkeypatch.setattr(ray_engine, "_ray", lambda: fake)
    mine = lambda signum, frame: None  # noqa: E731
    previous = signal.signal(signal.SIGTERM, mine)
    try:
        with ray_engine.RayPool(workers=2, address=None) as pool:
            assert pool.workers == 2
            assert signal.getsignal(signal.SIGTERM) is not mine  # ray's, while it runs
        assert signal.getsignal(signal.SIGTERM) is mine
    finally:
        signal.signal(signal.SIGTERM, previous)
