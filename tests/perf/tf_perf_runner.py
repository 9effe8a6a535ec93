"""Child of test_tf_perf.py: ``nndoctor perf`` on the Keras/TensorFlow fixtures of
``tests/fixtures/perf_tf/``, in one process (TensorFlow's import costs seconds), with ``import torch``
blocked as if torch were not installed. Prints one JSON line: each scenario's perf JSON and
findings, and whether torch got imported.

The ``--try`` re-runs of the scenarios in ``IN_PROCESS`` run ``perf.tf.rerun_child``'s ``main`` in this
process (the same arguments, in the working directory the child would get) instead of a fresh
``python -m nndoctor.commands.perf.tf.rerun_child`` each: a fresh one imports TensorFlow again, ~6 CPU-s
per re-run. Only compute_bound's: what its test checks (mixed precision injected, the loss
within its tolerance, a speed-up computed) is the re-run's, not its process's. input_bound's
re-runs stay real processes: its test checks a measured speed-up, and in one process the
sequential map's baseline ran faster than in a fresh one (12 ms a step vs 25), which hid the
gain; they also keep launching ``perf.tf.rerun_child`` covered end to end."""
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


# Scenarios whose --try re-runs run in this process (see the docstring).
IN_PROCESS = {"compute_bound"}


def launch_in_process(command, child, cwd, log, env=None, timeout=None):
    """``rerun._launch``'s contract, in this process: ``python -m CHILD ARGS`` run as ``main(ARGS)``
    in ``cwd``; its return code. (The environment is this process's: the test sets none for
    TensorFlow re-runs.)"""
    assert command[1:3] == ["-m", child], command
    saved_cwd, saved_argv = os.getcwd(), sys.argv[:]
    try:
        os.chdir(cwd)
        with open(log, "w") as handle, contextlib.redirect_stdout(handle):
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
        if name in IN_PROCESS:
            rerun._launch = launch_in_process
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
