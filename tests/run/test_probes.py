"""Instrumentation installs what the enabled checks ask for; per-run records live in the session's stash."""

from __future__ import annotations

import gc

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from nndoctor.crash_context import CRASH_CONTEXT, crash_context
from nndoctor.engine import Session
from nndoctor.instrument.dropout_probe import DROPOUT_RECORDS
from nndoctor.instrument.extensions import install, plain_features, torch_features
from nndoctor.instrument.inputs_probe import TARGET_RANGES, target_range_records
from nndoctor.instrument.numerics_probe import PROBE_STATE, probe_state
from nndoctor.perf.backend import PerfRun
from nndoctor.perf.config import PerfConfig
from nndoctor.perf.session import PerfSession
from nndoctor.perf.torch.recorder import PerfRecorder
from nndoctor.probes import PROBES
from nndoctor.registry import Check, all_checks, register
from nndoctor.stash import Stash, StashKey

_ITEM = torch.Tensor.item
EVENT_PATCHES = {entry.name for entry in torch_features() + plain_features() if entry.events}


def _installed(select):
    session = Session(select=select)
    installation = install(session)
    try:
        surface = {
            "cross_entropy": F.cross_entropy.__code__.co_name,
            "dropout": F.dropout,
            "manual_seed": torch.manual_seed,
            "clip": torch.nn.utils.clip_grad_norm_,
            "clip_code": torch.nn.utils.clip_grad_norm_.__code__.co_name,
            "gc_callbacks": len(gc.callbacks),
            "bn_init": torch.nn.modules.batchnorm._NormBase.__init__,
        }
        return session, list(installation.probes), surface
    finally:
        installation.uninstall()


def test_a_narrow_selection_installs_only_the_core_hooks():
    plain = {"dropout": F.dropout, "manual_seed": torch.manual_seed, "clip": torch.nn.utils.clip_grad_norm_,
             "gc_callbacks": len(gc.callbacks), "bn_init": torch.nn.modules.batchnorm._NormBase.__init__}
    _, probes, surface = _installed(["M101"])
    assert not set(probes) & set(PROBES), probes
    assert not set(probes) & EVENT_PATCHES, probes
    # What is patched is the core only: torch_hooks' loss wrapper, not the target-range probe,
    # and none of the functions the probes would wrap.
    assert surface["cross_entropy"] == "loss_function"
    assert {k: surface[k] for k in plain} == plain


def test_d107_installs_the_target_range_probe_and_nothing_else_on_demand():
    _, probes, surface = _installed(["D107"])
    assert set(probes) & set(PROBES) == {"target_ranges"}
    assert surface["cross_entropy"] == "probed"  # the probe's wrapper, outermost


def test_event_patches_follow_the_subscribed_event_kinds():
    # O110 subscribes to grad_clip only: clipping is patched, GradScaler.step is not.
    _, probes, surface = _installed(["O110"])
    assert "grad_clip" in probes and "scaler_step" not in probes
    assert surface["clip_code"] == "clip"  # training_probe's wrapper


# Probes that an internal subscriber needs rather than a check.
SUBSCRIBER_PROBES = {"perf_timers": PerfRecorder}


def test_all_checks_install_every_probe():
    session, probes, _ = _installed([])
    check_probes = set(PROBES) - set(SUBSCRIBER_PROBES)
    assert check_probes <= set(probes)
    assert not set(SUBSCRIBER_PROBES) & set(probes), probes
    assert session.needed_probes() == frozenset(check_probes)


def test_every_probe_has_an_installer_and_a_check_or_subscriber_that_needs_it():
    on_demand = {entry.name for entry in torch_features() + plain_features() if entry.needed}
    assert on_demand == set(PROBES)
    needed = {name for cls in all_checks() for name in cls.needs}
    for name, subscriber in SUBSCRIBER_PROBES.items():
        assert name in subscriber.needs
        needed.add(name)
    assert needed == set(PROBES), f"probes nothing needs: {set(PROBES) - needed}"


def test_perf_timers_are_installed_for_a_perf_session_only():
    from torch.nn.modules import module as module_mod

    hooks_before = len(module_mod._global_forward_pre_hooks)
    run = PerfRun(config=PerfConfig(warmup=1, steps=2))
    session = PerfSession(run, select=["P101"])
    installation = install(session)
    try:
        assert "perf_timers" in installation.probes
        assert torch.Tensor.item is not _ITEM  # the sync counter
        assert len(module_mod._global_forward_pre_hooks) > hooks_before  # the forward-start hook
    finally:
        installation.uninstall()
    assert torch.Tensor.item is _ITEM
    _, probes, _ = _installed([])
    assert "perf_timers" not in probes


def test_register_rejects_a_probe_that_does_not_exist():
    class Misspelled(Check):
        code, name, summary, fix = "Z999", "misspelled-probe", "s", "f"
        needs = frozenset({"construction_site"})

    with pytest.raises(ValueError, match="unknown probe"):
        register(Misspelled)


# -- the stash --------------------------------------------------------------------------------------
def test_stash_keys_are_distinct_objects_and_values_typed_by_key():
    stash = Stash()
    first, second = StashKey[int]("a"), StashKey[int]("a")
    stash[first] = 1
    assert first in stash and second not in stash
    assert stash.get(second, None) is None
    assert stash.setdefault(second, 2) == 2 and stash[second] == 2
    made = []
    assert stash.get_or_create(first, lambda: made.append(1) or 5) == 1 and not made
    del stash[first]
    assert first not in stash and len(stash) == 1


class _EvalDropout(nn.Module):
    def forward(self, x):
        return F.dropout(x, 0.5)  # no training=self.training


class _Broken(nn.Module):
    def forward(self, x):
        raise ValueError("boom")


def test_nested_sessions_do_not_see_each_others_records():
    outer = Session(select=["R101", "D107"])
    outer_installation = install(outer)
    try:
        inner = Session(select=["M110"])
        inner_installation = install(inner)
        try:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(0)
            with pytest.raises((IndexError, RuntimeError)):  # 3 is out of range for 3 classes
                F.cross_entropy(torch.zeros(4, 3), torch.tensor([0, 1, 2, 3]))
            _EvalDropout().eval()(torch.ones(2, 2))
            try:
                _Broken()(torch.ones(1))
            except ValueError as caught:
                error = caught
        finally:
            inner_installation.uninstall()
        # Each session holds exactly what its own checks asked for.
        assert probe_state(outer).seeds.calls.get("torch") == 1
        assert target_range_records(outer).pending.max == 3
        assert PROBE_STATE not in inner.stash and TARGET_RANGES not in inner.stash
        assert probe_state(inner).seeds.calls == {} and target_range_records(inner).pending is None
        assert DROPOUT_RECORDS in inner.stash and DROPOUT_RECORDS not in outer.stash
        assert [f.evidence.get("function") for f in inner.report.by_code("M110")] == ["dropout"]
        # Both sessions saw the crash through their own hooks, each in its own record.
        assert crash_context(outer) is not crash_context(inner)
        assert crash_context(inner).for_exception(error)["module_type"] == "_Broken"
        del inner.stash[CRASH_CONTEXT]  # as runner.finish does at the inner run's end
        assert crash_context(outer).for_exception(error)["module_type"] == "_Broken"
        assert crash_context(inner).for_exception(error) == {}
    finally:
        outer_installation.uninstall()


def test_a_later_session_starts_with_empty_records():
    first = Session(select=["R101"])
    installation = install(first)
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
    finally:
        installation.uninstall()
    second = Session(select=["R101"])
    installation = install(second)
    installation.uninstall()
    assert probe_state(first).seeds.calls.get("torch") == 1  # (manual_seed seeds cuda too)
    assert probe_state(second).seeds.calls == {}


def test_a_tensorflow_rerun_session_installs_no_torch_hook():
    """A TensorFlow ``perf --try`` re-run times Keras/TF steps only: it installs what a run
    without torch installs, and leaves torch's functions untouched."""
    from nndoctor.instrument.plain import PlainInstallation
    from nndoctor.perf.tf.inject import TfRerunSession

    before = (F.cross_entropy, torch.optim.Optimizer.step, torch.Tensor.item)
    installation = install(TfRerunSession(checks=[]))
    try:
        assert isinstance(installation, PlainInstallation)
        assert [f.name for f in installation.features] == [f.name for f in plain_features()]
        assert (F.cross_entropy, torch.optim.Optimizer.step, torch.Tensor.item) == before
    finally:
        installation.uninstall()
