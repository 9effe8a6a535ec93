"""Instrumentation installs what the enabled checks ask for; per-run records live in the session's stash."""

from __future__ import annotations

import gc

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from nndoctor.commands.perf.backend import PerfRun
from nndoctor.commands.perf.config import PerfConfig
from nndoctor.commands.perf.session import PerfSession
from nndoctor.commands.perf.torch.recorder import PerfRecorder
from nndoctor.core.engine import Session
from nndoctor.core.probes import KERAS_PROBES, KERAS_SCOPES, PROBES
from nndoctor.core.registry import Check, all_checks, framework_checks, register
from nndoctor.core.stash import Stash, StashKey
from nndoctor.instrument.dropout_probe import DROPOUT_RECORDS
from nndoctor.instrument.extensions import install, plain_features, torch_features
from nndoctor.instrument.inputs_probe import TARGET_RANGES, target_range_records
from nndoctor.instrument.numerics_probe import PROBE_STATE, probe_state
from nndoctor.run.crash_context import CRASH_CONTEXT, crash_context

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
    # (The Keras checks, and their probes, join once the script imports Keras: see below.)
    assert session.needed_probes() - set(KERAS_PROBES) == frozenset(check_probes)


def test_every_probe_has_an_installer_and_a_check_or_subscriber_that_needs_it():
    on_demand = {entry.name for entry in torch_features() + plain_features() if entry.needed}
    assert on_demand == set(PROBES)
    needed = {name for cls in all_checks() if cls.scope not in KERAS_SCOPES for name in cls.needs}
    for name, subscriber in SUBSCRIBER_PROBES.items():
        assert name in subscriber.needs
        needed.add(name)
    assert needed == set(PROBES), f"probes nothing needs: {set(PROBES) - needed}"


# -- the Keras and tf.data probes ---------------------------------------------------------------------
def _keras_installers():
    from nndoctor.keras.probes import keras_probes
    from nndoctor.tfdata.instrument import tfdata_probes

    return keras_probes("tensorflow") + tfdata_probes()


def test_every_keras_probe_has_an_installer_and_a_keras_check_or_variant_that_needs_it():
    installers = _keras_installers()
    assert all(entry.needed for entry in installers)
    assert sorted(entry.name for entry in installers) == sorted(KERAS_PROBES)
    # framework_checks: the registered checks of the scope, then its variants of shared codes
    keras_classes = [cls for scope in KERAS_SCOPES for cls in framework_checks(scope)]
    assert {cls.code for cls in keras_classes} >= {"K101", "K109", "N101", "O104", "K106"}
    needed = {name for cls in keras_classes for name in cls.needs}
    assert needed == set(KERAS_PROBES), f"probes nothing needs: {set(KERAS_PROBES) - needed}"
    # Each family names only its own observer's probes.
    assert all(set(cls.needs) <= set(KERAS_PROBES) for cls in keras_classes)
    assert not {name for cls in all_checks() if cls.scope not in KERAS_SCOPES for name in cls.needs} \
        & set(KERAS_PROBES)


def test_register_rejects_a_probe_of_another_framework():
    class KerasWithTorchProbe(Check):
        code, name, summary, fix = "Z998", "keras-with-torch-probe", "s", "f"
        scope = "keras"
        needs = frozenset({"seed_calls"})

    class TorchWithKerasProbe(Check):
        code, name, summary, fix = "Z997", "torch-with-keras-probe", "s", "f"
        needs = frozenset({"keras_batches"})

    for cls in (KerasWithTorchProbe, TorchWithKerasProbe):
        with pytest.raises(ValueError, match="unknown probe"):
            register(cls)


class _FakeKerasObserver:
    """Records which installer ``install_features`` calls (the TensorFlow list, without TensorFlow)."""

    def __init__(self, select):
        self.session = Session(select=select)
        self.session.add_checks(framework_checks("keras", select))  # what KerasObserver.patch does
        self.probes: list[str] = []
        self.called: list[str] = []
        self.loops = self

    def __getattr__(self, name):
        if not name.startswith("install_"):
            raise AttributeError(name)
        return lambda: self.called.append(name)

    def __setattr__(self, name, value):
        if name == "measure_gradients":
            self.called.append(name)
        object.__setattr__(self, name, value)


@pytest.mark.parametrize(("select", "expected"), [
    (["K109"], set()),
    (["K105"], {"keras_model_calls"}),
    (["O104"], {"gradient_norms"}),
    (["K101"], {"keras_batches", "tf_graph_stats", "keras_loss_calls"}),
    (["N101"], {"fit_losses", "tape_losses", "keras_model_calls"}),
])
def test_a_keras_selection_installs_only_the_probes_its_checks_need_tensorflow_list(select, expected):
    from nndoctor.instrument.features import install_features
    from nndoctor.keras.probes import keras_probes

    observer = _FakeKerasObserver(select)
    install_features(observer, keras_probes("tensorflow"))
    assert set(observer.probes) == expected
    assert len(observer.called) == len(expected)  # one installer per probe, none for the others


@pytest.mark.parametrize("code", ["K101", "K104", "K105", "K106", "K109", "D101", "D105", "L105", "L106",
                                  "N101", "N103", "O104"])
def test_a_run_selecting_one_keras_code_installs_only_its_probes(code):
    """In-process, Keras imported (torch backend, as this test session runs it): the observer adds the
    selected code's checks and installs exactly the probes they need that this backend has."""
    keras = pytest.importorskip("keras")
    from nndoctor.keras.probes import keras_probes
    from nndoctor.tfdata.instrument import tfdata_probes

    loss_name = "_compute_loss" if hasattr(keras.Model, "_compute_loss") else "compute_loss"
    before = (getattr(keras.Model, loss_name), keras.losses.Loss.__call__)
    session = Session(select=[code])
    installation = install(session)
    try:
        installed = set(installation.probes) & set(KERAS_PROBES)
        patched = (getattr(keras.Model, loss_name) is not before[0], keras.losses.Loss.__call__ is not before[1])
    finally:
        installation.uninstall()
    assert (getattr(keras.Model, loss_name), keras.losses.Loss.__call__) == before
    classes = [cls for scope in KERAS_SCOPES for cls in framework_checks(scope, [code])]
    assert classes and {cls.code for cls in classes} == {code}
    available = {entry.name for entry in keras_probes(keras.config.backend()) + tfdata_probes()}
    assert installed == {name for cls in classes for name in cls.needs} & available
    # What the probes patch follows: Model.compute_loss and Loss.__call__ stay Keras's own without them.
    assert patched == (bool(installed & {"keras_batches", "fit_losses"}), "keras_loss_calls" in installed)


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
    from nndoctor.commands.perf.tf.inject import TfRerunSession
    from nndoctor.instrument.plain import PlainInstallation

    before = (F.cross_entropy, torch.optim.Optimizer.step, torch.Tensor.item)
    installation = install(TfRerunSession(checks=[]))
    try:
        assert isinstance(installation, PlainInstallation)
        assert [f.name for f in installation.features] == [f.name for f in plain_features()]
        assert (F.cross_entropy, torch.optim.Optimizer.step, torch.Tensor.item) == before
    finally:
        installation.uninstall()
