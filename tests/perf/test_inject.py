"""The ``--try`` injector compiles the model the way ``torch.compile(model)`` runs it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from nndoctor.commands.perf.torch.inject import ChangeInjector  # noqa: E402
from nndoctor.core.engine import Session  # noqa: E402


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


class _Attention(torch.nn.Module):
    def forward(self, q, k, v):
        return torch.softmax(q @ k.transpose(-2, -1) * 0.5, dim=-1) @ v


class _Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)
        self.attention = _Attention()

    def forward(self, x):
        h = self.proj(x)
        return self.attention(h, h, h)


@pytest.mark.parametrize(("also", "then"), [("compile", "inductor"), ("cuda-graphs", "reduce-overhead")])
def test_sdpa_with_compile_is_one_compilation_that_rewrites_the_attention(monkeypatch, also, then):
    """A module compiled inside an outer torch.compile is inlined and its own backend never
    runs: with compile (or CUDA graphs) the root is compiled once by the SDPA-rewriting backend,
    which hands the rewritten graph to Inductor."""
    from nndoctor.commands.perf.torch.sdpa import SdpaRewriter

    compiled = []
    monkeypatch.setattr(torch, "compile", lambda function, mode=None, backend=None: compiled.append(backend) or function)
    model = _Model().train()
    injector = ChangeInjector(Session(checks=[]), ["sdpa", also])
    with torch.enable_grad():
        model(torch.randn(2, 3, 4))  # the first training forward: the tracer sees the attention
    _first_training_forward(injector, model)
    assert len(compiled) == 1 and isinstance(compiled[0], SdpaRewriter) and compiled[0].then == then
    assert model.attention._compiled_call_impl is None  # no inner compile to be inlined
    assert any(entry.startswith("compile") for entry in injector.applied)
