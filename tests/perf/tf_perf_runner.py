"""Child of test_tf_perf.py: ``nndoctor perf`` on the Keras/TensorFlow fixtures of
``tests/fixtures/perf_tf/``, in one process (TensorFlow's import costs seconds), with ``import torch``
blocked as if torch were not installed. Prints one JSON line: each scenario's perf JSON and
findings, and whether torch got imported.

The ``--try`` re-runs run ``perf.tf.rerun_child``'s ``main`` in this process (the same arguments,
in the working directory the child would get) instead of a fresh ``python -m
nndoctor.commands.perf.tf.rerun_child`` each: a fresh one imports TensorFlow again, ~5 s per
re-run, most of a re-run's time. What the tests check of those re-runs (the change injected
at the user's line, the loss after the window, the step time) is the re-run's, not its process's.
Each in-process re-run leaves the TensorFlow/Keras classes as it found them (``pristine_classes``):
a fresh process starts with them unpatched, and a re-run's patches outlived it otherwise (the
parallel-map stage wrapper did: the next baseline then mapped in parallel, 12 ms a step where a
fresh process took 25, which hid the gain).

One re-run stays a real process (``REAL_PROCESS``): input_bound's first parallel-map re-run keeps
launching ``perf.tf.rerun_child`` covered end to end, on the run it must leave without hanging
(stopped mid-epoch inside a parallel ``numpy_function`` map, see its ``__main__``)."""
import contextlib
import importlib
import importlib.abc
import json
import os
import sys
import tempfile

SCENARIOS = {
    "input_bound": ["--warmup", "3", "--steps", "10", "--try", "prefetch,parallel-map,channels_last",
                    "--try-repeats", "2", "input_bound_fit.py"],
    "compute_bound": ["--warmup", "3", "--steps", "8", "--try", "amp", "--try-repeats", "2",
                      "compute_bound_fit.py"],
    "custom_loop": ["--warmup", "3", "--steps", "10", "custom_loop.py"],
}


# Per scenario, the change whose first --try re-run is a real process (see the docstring).
REAL_PROCESS = {"input_bound": "parallel-map"}
# The classes a re-run's changes and nndoctor's instrumentation patch (tensorflow.python and
# keras.src paths, the ones tests/keras/tf_backend_runner.py checks, and tf.data's).
PATCHED = (("tensorflow.python.data.ops.dataset_ops", "DatasetV2"), ("tensorflow.python.eager.backprop", "GradientTape"),
           ("tensorflow.python.eager.polymorphic_function.polymorphic_function", "Function"),
           ("keras.src.callbacks.callback_list", "CallbackList"), ("keras.src.models.model", "Model"),
           ("keras.src.layers.layer", "Layer"), ("keras.src.optimizers.base_optimizer", "BaseOptimizer"))


@contextlib.contextmanager
def pristine_classes():
    """Whatever the block sets on the ``PATCHED`` classes is undone when it ends."""
    owners = [getattr(importlib.import_module(module), name) for module, name in PATCHED]
    saved = [(owner, dict(vars(owner))) for owner in owners]
    try:
        yield
    finally:
        for owner, attributes in saved:
            for name in [n for n in vars(owner) if n not in attributes]:
                delattr(owner, name)
            for name, value in attributes.items():
                if vars(owner).get(name) is not value:
                    setattr(owner, name, value)


def launch_in_process(command, child, cwd, log, env=None, timeout=None):
    """``rerun._launch``'s contract, in this process: ``python -m CHILD ARGS`` run as ``main(ARGS)``
    in ``cwd``; its return code. (The environment is this process's: the test sets none for
    TensorFlow re-runs.)"""
    assert command[1:3] == ["-m", child], command
    saved_cwd, saved_argv = os.getcwd(), sys.argv[:]
    try:
        os.chdir(cwd)
        with open(log, "w") as handle, contextlib.redirect_stdout(handle), pristine_classes():
            return importlib.import_module(child).main(command[3:])
    finally:
        os.chdir(saved_cwd)
        sys.argv = saved_argv


class BlockTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in ("torch", "torchvision"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


def main() -> None:
    fixtures = sys.argv[1]
    wanted = sys.argv[2:] or list(SCENARIOS)
    sys.meta_path.insert(0, BlockTorch())
    from nndoctor.cli import main as cli
    from nndoctor.commands.perf import rerun

    folder = tempfile.mkdtemp(prefix="nndoctor-tfperf-")
    results = {}
    for name in wanted:
        args = SCENARIOS[name]
        report = os.path.join(folder, f"{name}.json")
        launch = rerun._launch
        real = [REAL_PROCESS.get(name)]  # emptied once launched

        def launch_here_or_there(command, child, cwd, log, env=None, timeout=None, launch=launch, real=real):
            if command[command.index("--changes") + 1] in real:
                real.clear()
                return launch(command, child, cwd, log, env, timeout)
            return launch_in_process(command, child, cwd, log, env, timeout)

        rerun._launch = launch_here_or_there
        try:
            status = cli(["perf", "--quiet", "--json", report, *args[:-1], os.path.join(fixtures, args[-1])])
        finally:
            rerun._launch = launch
        with open(report) as handle:
            data = json.load(handle)
        results[name] = {"status": status, "perf": data["extra"]["perf"], "internal_errors": data["internal_errors"],
                         "findings": [[f["code"], (f.get("location") or {}).get("line"), f["message"],
                                       f.get("fix")] for f in data["findings"]]}
    print(json.dumps({"results": results, "torch_imported": "torch" in sys.modules}), flush=True)
    os._exit(0)  # stopped tf.data pipelines with py_functions must not hold the exit


if __name__ == "__main__":
    main()
