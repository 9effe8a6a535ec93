"""``nndoctor env``: the install and driver doctor (frameworks, CUDA builds, driver, GPUs, packages)."""
