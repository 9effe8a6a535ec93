"""Run as ``python probe_script.py FRAMEWORK`` in a child process; prints one JSON object.

Importing a framework can crash, hang on a broken driver, or print pages of library-loading
errors: doing it in a child keeps ``nndoctor env`` alive and lets it read that output.
This file imports nothing from nndoctor, so it works in any interpreter.
"""

from __future__ import annotations

import json
import sys
import traceback
from typing import Any


def _torch() -> dict:
    import torch

    facts: dict[str, Any] = {
        "version": torch.__version__,
        "file": torch.__file__,
        "cuda_build": torch.version.cuda,
        "hip_build": getattr(torch.version, "hip", None),
        "cudnn": None,
        "nccl": None,
        "cuda_available": False,
        "device_count": 0,
        "arch_list": [],
        "cuda_error": None,
    }
    try:
        facts["cuda_available"] = bool(torch.cuda.is_available())
        facts["device_count"] = int(torch.cuda.device_count())
        facts["arch_list"] = list(torch.cuda.get_arch_list())
    except Exception as error:  # noqa: BLE001 - the error text is the fact
        facts["cuda_error"] = f"{type(error).__name__}: {error}"
    try:
        facts["cudnn"] = torch.backends.cudnn.version() if facts["cuda_build"] else None
    except Exception as error:  # noqa: BLE001
        facts["cudnn_error"] = f"{type(error).__name__}: {error}"
    try:
        nccl = torch.cuda.nccl.version() if facts["cuda_build"] else None
        facts["nccl"] = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else nccl
    except Exception:  # noqa: BLE001 - NCCL is optional in some builds
        pass
    return facts


def _tensorflow() -> dict:
    import tensorflow as tf

    build = dict(tf.sysconfig.get_build_info())
    return {
        "version": tf.__version__,
        "file": tf.__file__,
        "cuda_build": build.get("cuda_version") if build.get("is_cuda_build") else None,
        "cudnn_build": build.get("cudnn_version"),
        "gpus": [d.name for d in tf.config.list_physical_devices("GPU")],
    }


def _keras() -> dict:
    import keras

    return {"version": keras.__version__, "file": keras.__file__, "backend": keras.backend.backend()}


def _jax() -> dict:
    import jax

    return {"version": jax.__version__, "file": jax.__file__,
            "devices": [f"{d.platform}:{d.id}" for d in jax.devices()]}


PROBES = {"torch": _torch, "tensorflow": _tensorflow, "keras": _keras, "jax": _jax}


def main() -> None:
    name = sys.argv[1]
    try:
        result = {"name": name, "importable": True, **PROBES[name]()}
    except ModuleNotFoundError as error:
        missing = error.name == name or (error.name or "").split(".")[0] == name
        result = {"name": name, "importable": False, "installed": not missing,
                  "import_error": f"{type(error).__name__}: {error}"}
    except BaseException as error:  # noqa: BLE001 - any import failure is reported, not raised
        result = {"name": name, "importable": False, "installed": True,
                  "import_error": f"{type(error).__name__}: {error}",
                  "traceback": traceback.format_exc()[-2000:]}
    sys.stdout.flush()
    print("NNDOCTOR-PROBE " + json.dumps(result, default=str))


if __name__ == "__main__":
    main()
