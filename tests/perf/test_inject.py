"""The ``--try`` injector compiles the model the way ``torch.compile(model)`` runs it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from nndoctor.engine import Session  # noqa: E402
from nndoctor.perf.inject import ChangeInjector  # noqa: E402


def _first_training_forward(injector: ChangeInjector, module: torch.nn.Module) -> None:
    injector.on_forward(SimpleNamespace(module=module, is_loss=False, grad_enabled=True, training=True))


@pytest.mark.parametrize(("change", "mode"), [("compile", None), ("cuda-graphs", "reduce-overhead")])
def test_compiles_forward_in_place_and_keeps_module_hooks_eager(monkeypatch, change, mode):
    compiled: list[tuple[object, object]] = []

    def fake_compile(function, mode=None):
        compiled.append((function, mode))
        return function  # the call still runs: the hooks below must see it

    monkeypatch.setattr(torch, "compile", fake_compile)
    model = torch.nn.Sequential(torch.nn.Linear(4, 2))
    original_forward = model.forward
    injector = ChangeInjector(Session(checks=[]), [change])
    _first_training_forward(injector, model)

    assert compiled == [(original_forward, mode)]
    # In place, through forward: not module.compile(), which puts the whole call (and the
    # module-call hooks nndoctor and the user registered) inside the compiled graph.
    assert model._compiled_call_impl is None
    assert "forward" in vars(model)  # the compiled forward, set on this module only
    calls = []
    handle = model.register_forward_pre_hook(lambda module, args: calls.append(module))
    model(torch.zeros(1, 4))
    handle.remove()
    assert calls == [model]
    assert injector.applied == [f"compile(mode='{mode}') on Sequential" if mode else "compile on Sequential"]


def test_cuda_graphs_and_compile_together_compile_once(monkeypatch):
    compiled = []
    monkeypatch.setattr(torch, "compile", lambda function, mode=None: compiled.append(mode) or function)
    injector = ChangeInjector(Session(checks=[]), ["compile", "cuda-graphs"])
    _first_training_forward(injector, torch.nn.Linear(2, 2))
    assert compiled == ["reduce-overhead"]
