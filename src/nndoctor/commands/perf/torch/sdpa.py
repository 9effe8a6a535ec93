"""``--try sdpa``: hand-written attention, ``softmax(Q Kᵀ · s + mask) V``, found in the user's
step and replaced by ``torch.nn.functional.scaled_dot_product_attention`` (one fused kernel:
FlashAttention / memory-efficient attention on CUDA, no T×T score matrix kept for backward).

Two parts, both run inside the ``--try`` re-run child:

- ``AttentionTracer`` records, during one training forward, the torch calls of the step
  (a ``TorchFunctionMode``) and follows each matmul's output through scaling, masking and
  softmax into a second matmul; the innermost module in which that chain closes is where
  the attention is written.
- ``SdpaRewriter`` is a ``torch.compile`` backend for those modules only: Dynamo hands it the
  module's forward as an FX graph of torch calls (shapes specialised, so ``math.sqrt(d)`` is a
  constant); the rewriter replaces each chain of the supported form by one
  ``scaled_dot_product_attention`` node, checks on the real inputs that the outputs agree
  (dropout off in both), and runs the graph eagerly — no Inductor, so the measured change is
  the attention kernel alone.

Supported form (anything else is left as it is, with the reason): ``q @ kᵀ`` (``matmul``/``bmm``
with ``k.transpose(-2, -1)``), optionally times/divided by a constant, optionally
``masked_fill(cond, -inf or ≤ -1e4)`` or ``+ additive_mask`` (added after the scaling),
``softmax(dim=-1)``, optionally ``dropout(p)``, ``@ v``; no intermediate used elsewhere.
An attention left as written (e.g. Hugging Face's eager attention, which returns its weights)
is timed instead as a microbenchmark on the q, k, v it really computes — hand-written against
SDPA, forward and backward — and the result says that it is a microbenchmark.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

_MATMULS = {"matmul", "__matmul__", "bmm"}
_FLOP_OPS = _MATMULS | {"linear", "mm", "addmm", "baddbmm"}  # counted for the attention's share
_SOFTMAX = {"softmax"}
_DROPOUT = {"dropout"}
# Calls that carry the scores along on the way to softmax (scaling, masking, casts).
_PASS_THROUGH = {"mul", "__mul__", "__rmul__", "div", "truediv", "__truediv__", "masked_fill", "add", "__add__",
                 "__radd__", "sub", "__sub__", "float", "to", "type_as", "where", "__getitem__",
                 "masked_fill_", "mul_", "div_", "add_"}
_DIVISIONS = {"div", "truediv", "__truediv__"}
_SCALES = {"mul", "__mul__", "__rmul__", *_DIVISIONS}
MASK_FLOOR = -1e4  # a fill value at or below this is "masked out" after softmax (exp(-1e4) == 0)


def _op_name(func: Any) -> str:
    return getattr(func, "__name__", "") or ""


def _flat_tensors(args: Any, kwargs: Any) -> list[Any]:
    import torch

    out = []
    for value in (*args, *(kwargs or {}).values()):
        if isinstance(value, torch.Tensor):
            out.append(value)
        elif isinstance(value, (list, tuple)):
            out.extend(v for v in value if isinstance(v, torch.Tensor))
    return out


class AttentionTracer:
    """Finds, during one forward, the modules in which ``softmax(matmul) → matmul`` closes.

    ``start()`` before the forward, ``stop()`` after it; ``modules`` then lists the innermost
    module of each chain (in call order, each once). Tensors are held only until ``stop()``.
    """

    def __init__(self) -> None:
        from torch.overrides import TorchFunctionMode

        self.stack: list[Any] = []
        self.modules: list[Any] = []
        self._scores: dict[int, Any] = {}
        self._probs: dict[int, Any] = {}
        tracer = self

        class _Mode(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                tracer._see(_op_name(func), _flat_tensors(args, kwargs), out)
                return out

        self._mode = _Mode()
        self._hooks: list[Any] = []
        self.started = self.stopped = False
        # What ``perf/predict.py`` reads: fused attention calls already there, and the
        # multiply-adds of every matmul against those of the attention (its Q Kᵀ and P V).
        self.sdpa_calls = 0
        self.matmul_flops = 0.0
        self.attention_flops = 0.0

    def start(self, root: Any = None) -> None:
        """From inside ``root``'s forward pre-hook (``root`` is then already being called)."""
        from torch.nn.modules import module as module_mod

        self.started = True
        self.stack = [root] if root is not None else []
        self._hooks = [module_mod.register_module_forward_pre_hook(self._pre),
                       module_mod.register_module_forward_hook(self._post, always_call=True)]
        self._mode.__enter__()

    def stop(self) -> None:
        if self.stopped or not self.started:
            return
        self.stopped = True
        self._mode.__exit__(None, None, None)
        for hook in self._hooks:
            hook.remove()
        self._hooks, self._scores, self._probs, self.stack = [], {}, {}, []

    def _pre(self, module: Any, args: Any) -> None:
        self.stack.append(module)

    def _post(self, module: Any, args: Any, output: Any) -> None:
        if self.stack and self.stack[-1] is module:
            self.stack.pop()

    def _see(self, name: str, inputs: list[Any], out: Any) -> None:
        import torch

        if not isinstance(out, torch.Tensor):
            return
        first = id(inputs[0]) if inputs else None
        if name == "scaled_dot_product_attention":
            self.sdpa_calls += 1
            if len(inputs) >= 3:  # (B, H, T, d) x (B, H, S, d): Q Kᵀ and P V
                flops = 4.0 * out.numel() * inputs[1].shape[-2]
                self.matmul_flops += flops
                self.attention_flops += flops
            return
        if name in _FLOP_OPS and inputs and inputs[0].dim() >= 1:
            self.matmul_flops += 2.0 * out.numel() * inputs[0].shape[-1]
        if name in _MATMULS:
            if first in self._probs:
                # P V, and Q Kᵀ before it has the same multiply-adds (T×T×d per head).
                self.attention_flops += 4.0 * out.numel() * inputs[0].shape[-1]
                module = self.stack[-1] if self.stack else None
                if module is not None and all(m is not module for m in self.modules):
                    self.modules.append(module)
            else:
                self._scores[id(out)] = out
        elif name in _SOFTMAX and first in self._scores:
            self._probs[id(out)] = out
        elif name in _DROPOUT and first in self._probs:
            self._probs[id(out)] = out
        elif name in _PASS_THROUGH and any(id(t) in self._scores for t in inputs):
            self._scores[id(out)] = out


# -- the FX rewrite -------------------------------------------------------------------------
@dataclass
class AttentionMatch:
    final: Any  # the probs @ v node
    query: Any
    key: Any
    value: Any
    scale: float
    mask: Any  # a node or None
    mask_is_bool: bool
    dropout_p: float
    description: str


def _target_name(node: Any) -> str:
    if node.op == "call_method":
        return str(node.target)
    if node.op == "call_function":
        return _op_name(node.target)
    return ""


def _is(node: Any, names: set[str]) -> bool:
    return hasattr(node, "op") and _target_name(node) in names


def _ndim(node: Any) -> int | None:
    value = node.meta.get("example_value", node.meta.get("val")) if hasattr(node, "meta") else None
    dim = getattr(value, "dim", None)
    return dim() if dim is not None else None


def _last_two(dims: tuple[Any, ...], ndim: int | None) -> bool:
    if not all(isinstance(d, int) for d in dims):
        return False
    wanted = {-2, -1}
    if ndim is not None:
        dims = tuple(d - ndim if d >= 0 else d for d in dims)
    return set(dims) == wanted


def _transposed_key(node: Any) -> Any:
    """``k`` when ``node`` is ``k.transpose(-2, -1)`` (or ``torch.transpose``), else None."""
    if not _is(node, {"transpose"}) or len(node.args) < 3:
        return None
    source = node.args[0]
    return source if _last_two(tuple(node.args[1:3]), _ndim(source)) else None


def _single_use(node: Any) -> bool:
    return len(node.users) == 1


def _arg(node: Any, index: int, name: str, default: Any) -> Any:
    if len(node.args) > index:
        return node.args[index]
    return node.kwargs.get(name, default)


def _dropout_module(node: Any, modules: dict[str, Any]) -> Any:
    """The ``nn.Dropout`` a ``call_module`` node calls (symbolic tracing keeps modules)."""
    import torch

    if getattr(node, "op", None) != "call_module":
        return None
    module = modules.get(str(node.target))
    return module if isinstance(module, torch.nn.Dropout) else None


def match_attention(final: Any, modules: dict[str, Any] | None = None) -> AttentionMatch | str | None:
    """The attention ending in ``final`` (a matmul node), a reason it cannot be replaced, or
    None when ``final`` is not the second matmul of an attention. ``modules``: the graph
    module's submodules by name, for dropouts called as modules."""
    if not _is(final, _MATMULS) or len(final.args) < 2:
        return None
    probs, value = final.args[0], final.args[1]
    dropout_p = 0.0
    dropout_module = _dropout_module(probs, modules or {})
    if dropout_module is not None:
        dropout_p = float(dropout_module.p) if dropout_module.training else 0.0
        if not _single_use(probs):
            return "the attention weights are used elsewhere"
        probs = probs.args[0]
    elif _is(probs, _DROPOUT):
        p, training = _arg(probs, 1, "p", 0.5), _arg(probs, 2, "training", True)
        if not isinstance(p, (int, float)) or not isinstance(training, bool):
            return "a dropout whose rate is not a constant"
        dropout_p = float(p) if training else 0.0
        if not _single_use(probs):
            return "the attention weights are used elsewhere"
        probs = probs.args[0]
    if not _is(probs, _SOFTMAX):
        return None
    dim = _arg(probs, 1, "dim", None)
    if not (isinstance(dim, int) and _last_two((dim, -2), _ndim(probs.args[0]))):
        return "softmax over another dimension than the last"
    if not _single_use(probs):
        return "the attention weights are used elsewhere"
    scores = probs.args[0]
    scale, mask, mask_is_bool, scaled_above_mask = 1.0, None, False, False
    parts = []
    while not _is(scores, _MATMULS):
        if not hasattr(scores, "op") or not _single_use(scores):
            return "the attention scores are used elsewhere" if hasattr(scores, "op") else None
        name = _target_name(scores)
        if name == "masked_fill" and mask is None:
            fill = _arg(scores, 2, "value", None)
            if not isinstance(fill, (int, float)) or fill > MASK_FLOOR:
                return f"a masked_fill with {fill!r}, not -inf"
            mask, mask_is_bool = ("not", scores.args[1]), True
            parts.append("boolean mask")
            scores = scores.args[0]
        elif name in ("add", "__add__", "__radd__") and mask is None and len(scores.args) == 2:
            left, right = scores.args
            if scaled_above_mask:
                return "an additive mask added before the scaling"
            tensor_side = [a for a in (left, right) if hasattr(a, "op")]
            if len(tensor_side) != 2:
                return "a constant added to the scores"
            # The scores chain continues on the side that leads back to the first matmul.
            chain, other = (left, right) if _leads_to_matmul(left) else (right, left)
            mask, mask_is_bool = other, False
            parts.append("additive mask")
            scores = chain
        elif name in _SCALES and len(scores.args) == 2:
            left, right = scores.args
            constant = right if not hasattr(right, "op") else left if not hasattr(left, "op") else None
            chain = left if constant is right else right
            if not isinstance(constant, (int, float)) or constant <= 0 or (
                    name in _DIVISIONS and constant is left):
                return "a scaling by something other than a positive constant"
            scale = scale / constant if name in _DIVISIONS else scale * constant
            scaled_above_mask = scaled_above_mask or mask is None
            scores = chain
        else:
            return None
    query, key_t = scores.args[0], scores.args[1]
    key = _transposed_key(key_t)
    if key is None:
        return "Kᵀ is not a transpose of the last two dimensions of K"
    if not _single_use(scores):
        return "the attention scores are used elsewhere"
    parts.append(f"scale {scale:.4g}")
    if dropout_p:
        parts.append(f"dropout {dropout_p:g}")
    return AttentionMatch(final, query, key, value, scale, mask[1] if isinstance(mask, tuple) else mask,
                          mask_is_bool, dropout_p, ", ".join(parts))


def _leads_to_matmul(node: Any, depth: int = 8) -> bool:
    while depth and hasattr(node, "op"):
        if _is(node, _MATMULS):
            return True
        if not node.args:
            return False
        node = node.args[0]
        depth -= 1
    return False


def rewrite(gm: Any, *, dropout: bool = True) -> tuple[Any, list[str], list[str]]:
    """A copy of ``gm`` with every supported attention replaced (and, with ``dropout=False``,
    every dropout removed: the copy used to compare outputs); the replaced and the refused."""
    import torch
    import torch.nn.functional as F

    graph = torch.fx.Graph()
    output = graph.graph_copy(gm.graph, {})
    graph.output(output)
    copy = torch.fx.GraphModule(gm, graph)
    modules = dict(gm.named_modules())
    done, refused = [], []
    for node in list(graph.nodes):
        found = match_attention(node, modules)
        if found is None:
            continue
        if isinstance(found, str):
            refused.append(found)
            continue
        with graph.inserting_before(node):
            mask = found.mask
            if mask is not None and found.mask_is_bool:
                mask = graph.call_function(torch.logical_not, (mask,))
            fused = graph.call_function(F.scaled_dot_product_attention, (found.query, found.key, found.value),
                                        {"attn_mask": mask, "dropout_p": found.dropout_p if dropout else 0.0,
                                         "scale": found.scale})
        node.replace_all_uses_with(fused)
        graph.erase_node(node)
        done.append(found.description)
    if not dropout:
        _strip_dropout(graph, modules)
    graph.eliminate_dead_code()
    graph.lint()
    copy.recompile()
    return copy, done, refused


def outputs_agree(reference: Any, candidate: Any) -> tuple[bool, float]:
    """Same structure and values within float tolerance: 1e-3 of the output's scale in
    float32 (the fused kernel sums in another order), 3e-2 in half precision."""
    import torch

    ref = [t for t in _flat_tensors(reference if isinstance(reference, (list, tuple)) else (reference,), {})]
    new = [t for t in _flat_tensors(candidate if isinstance(candidate, (list, tuple)) else (candidate,), {})]
    if len(ref) != len(new) or not ref:
        return False, float("inf")
    worst = 0.0
    for a, b in zip(ref, new):
        if a.shape != b.shape:
            return False, float("inf")
        a, b = a.detach().float(), b.detach().float()
        scale = a.abs().max().item() if a.numel() else 0.0
        worst = max(worst, (a - b).abs().max().item() / max(scale, 1e-6) if a.numel() else 0.0)
    tolerance = 1e-3 if all(t.dtype in (torch.float32, torch.float64) for t in ref) else 3e-2
    return worst <= tolerance, worst


_IN_PLACE = {"copy_", "add_", "mul_", "div_", "sub_", "fill_", "zero_", "masked_fill_", "index_put_"}


class SdpaRewriter:
    """``torch.compile`` backend: the module's graph with its attention replaced, run eagerly.

    ``applied`` and ``notes`` are the injector's lists: what was replaced, and why a found
    attention was left as written."""

    def __init__(self, where: str, applied: list[str], notes: list[str], then: str | None = None) -> None:
        self.where, self.applied, self.notes = where, applied, notes
        # None: run the rewritten graph eagerly (the attention kernel alone is measured);
        # "inductor" / "reduce-overhead": hand it on to Inductor (with CUDA graphs), for
        # --try sdpa together with compile or cuda-graphs — one compilation of the whole forward.
        self.then = then

    def _finish(self, gm: Any, example_inputs: list[Any]) -> Any:
        if self.then is None:
            return gm.forward
        from torch._inductor.compile_fx import compile_fx

        patches = {"triton.cudagraphs": True} if self.then == "reduce-overhead" else None
        return compile_fx(gm, example_inputs, config_patches=patches)

    def __call__(self, gm: Any, example_inputs: list[Any]) -> Any:
        found = self._rewrite(gm, example_inputs)
        return self._finish(found if found is not None else gm, example_inputs)

    def _rewrite(self, gm: Any, example_inputs: list[Any]) -> Any:
        """The graph with its attention replaced, or None (left as written, with the note)."""
        import torch

        fused, done, refused = rewrite(gm)
        timing = None
        if refused and not done:
            timing = _microbenchmark(gm, example_inputs)
        for reason in dict.fromkeys(refused):
            note = f"attention in {self.where} left as written: {reason}"
            if not done and timing:
                note += f"; {timing}"
            if not any(n.startswith(f"attention in {self.where} left as written: {reason}") for n in self.notes):
                self.notes.append(note)
        if not done:
            return None
        if any(_target_name(n) in _IN_PLACE for n in gm.graph.nodes):
            self.notes.append(f"attention in {self.where} left as written: the graph changes tensors in "
                              "place, so the outputs cannot be compared safely")
            return None
        plain_check, _, _ = rewrite(gm, dropout=False)
        strip_only = _without_attention_rewrite(gm)
        with torch.no_grad():
            agree, worst = outputs_agree(strip_only(*example_inputs), plain_check(*example_inputs))
        if not agree:
            self.notes.append(f"attention in {self.where} left as written: scaled_dot_product_attention's "
                              f"output differs by {worst:.2e} (relative) on the real inputs")
            return None
        entry = f"sdpa in {self.where} ({'; '.join(dict.fromkeys(done))}; outputs agree within {worst:.1e})"
        if not any(a.startswith(f"sdpa in {self.where} ") for a in self.applied):  # once, not per recompile
            self.applied.append(entry)
        return fused


def _without_attention_rewrite(gm: Any) -> Any:
    """A copy of ``gm`` with its dropouts removed and nothing else changed."""
    import torch

    graph = torch.fx.Graph()
    graph.output(graph.graph_copy(gm.graph, {}))
    _strip_dropout(graph, dict(gm.named_modules()))
    copy = torch.fx.GraphModule(gm, graph)
    copy.recompile()
    return copy




def _strip_dropout(graph: Any, modules: dict[str, Any]) -> None:
    for node in list(graph.nodes):
        if _is(node, _DROPOUT) or _dropout_module(node, modules) is not None:
            node.replace_all_uses_with(node.args[0])
            graph.erase_node(node)


def attention_operands(final: Any) -> tuple[Any, Any, Any] | None:
    """(q, k, v) nodes of a softmax(q kᵀ …) v chain ending in ``final``, however its
    intermediates are used (for the microbenchmark of an attention that is not replaced)."""
    if not _is(final, _MATMULS) or len(final.args) < 2:
        return None
    node = final.args[0]
    for _ in range(16):  # back through dropout, softmax, masks and scaling to the first matmul
        if not hasattr(node, "op") or not node.args:
            return None
        if _is(node, _MATMULS):
            key = _transposed_key(node.args[1])
            return (node.args[0], key, final.args[1]) if key is not None else None
        node = node.args[0]
    return None


def _microbenchmark(gm: Any, example_inputs: list[Any], repeats: int = 5) -> str | None:
    """Hand-written attention against F.scaled_dot_product_attention on the q, k, v the
    graph really computes (forward + backward, no mask on either side): what the kernel alone
    would gain on these shapes — a microbenchmark, not the user's step."""
    import time

    import torch
    import torch.nn.functional as F

    chains = [ops for ops in (attention_operands(n) for n in gm.graph.nodes) if ops is not None]
    if not chains:
        return None
    wanted = set(chains[0])
    values: dict[Any, Any] = {}

    class Capture(torch.fx.Interpreter):
        def run_node(self, n: Any) -> Any:
            out = super().run_node(n)
            if n in wanted and isinstance(out, torch.Tensor):
                values[n] = out.detach()
            return out

    try:
        with torch.no_grad():
            Capture(gm).run(*example_inputs)
        q, k, v = (values[n].clone().requires_grad_(True) for n in chains[0])
    except Exception:  # noqa: BLE001 - no timing rather than a broken trial
        return None
    scale = 1.0 / (q.shape[-1] ** 0.5)

    def by_hand() -> Any:
        return torch.softmax((q @ k.transpose(-2, -1)) * scale, dim=-1) @ v

    def fused() -> Any:
        return F.scaled_dot_product_attention(q, k, v, scale=scale)

    def seconds(attention: Any) -> float:
        def sync() -> None:
            if q.is_cuda:
                torch.cuda.synchronize()

        attention().sum().backward()  # warm-up
        sync()
        started = time.perf_counter()
        for _ in range(repeats):
            attention().sum().backward()
        sync()
        return (time.perf_counter() - started) / repeats

    hand, sdpa = seconds(by_hand), seconds(fused)
    return (f"measured on its shapes instead (q {tuple(q.shape)}, {q.dtype}, forward + backward, a microbenchmark, "
            f"not your step): scaled_dot_product_attention {1000 * sdpa:.2f} ms vs {1000 * hand:.2f} ms "
            f"hand-written ({hand / sdpa:.2f}×)")
