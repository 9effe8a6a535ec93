"""Every command's machinery but ``run``'s: explain, data, ckpt, env, preflight, fix,
perf, demo (each package's ``cli`` is its front end)."""
