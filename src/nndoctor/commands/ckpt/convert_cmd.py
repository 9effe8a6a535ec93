"""Convert Keras weights (.h5, .keras, .weights.h5, or a TensorFlow checkpoint / SavedModel of a
Keras model) into a PyTorch state_dict for the model built by --model MODULE:CALLABLE, pairing
layers by order within each type, then verify it: the PyTorch model with the converted weights
must give the Keras model's outputs on the same random inputs (Keras runs on its torch backend;
no TensorFlow needed; a SavedModel's graph is never run: give --keras-model to verify)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from rich.console import Console

from nndoctor.commands.ckpt import checks
from nndoctor.commands.ckpt.keras_convert import UnknownEpsilon, plan_conversion
from nndoctor.commands.ckpt.reader import read_checkpoint
from nndoctor.commands.ckpt.render import escape
from nndoctor.commands.ckpt.writer import check_output_path, write_state_dict
from nndoctor.core.findings import Location, Report
from nndoctor.util.errors import UsageError


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", help="Keras weights: .keras, .h5, .weights.h5, a TensorFlow checkpoint or SavedModel")
    parser.add_argument("-o", "--output", required=True, help="PyTorch state dict to write (.safetensors or .pt)")
    parser.add_argument("--model", required=True, metavar="MODULE:CALLABLE", help="builds the PyTorch model")
    parser.add_argument("--keras-model", metavar="MODULE:CALLABLE",
                        help="builds the Keras model (needed to verify a weights-only file or a TensorFlow checkpoint)")
    parser.add_argument("--atol", type=float, default=1e-4, help="largest accepted output difference (default 1e-4)")
    parser.add_argument("--input-layout", choices=["auto", "channels_first", "channels_last"], default="auto",
                        help="layout the PyTorch model expects for the Keras (channels-last) input")
    parser.add_argument("--no-verify", action="store_true", help="skip running the two models")


def unknown_epsilon_note(unknown: list[UnknownEpsilon]) -> tuple[str, dict[str, Any], str]:
    """(sentence, evidence, fix) for normalization layers whose Keras epsilon the weights file
    does not record while the PyTorch modules use another eps than Keras' default."""
    from nndoctor.report.capping import cap_items

    names = [f"`{u.torch_name}`" for u in unknown]
    kinds = sorted({"BatchNormalization" if u.kind == "batch_normalization" else "LayerNormalization"
                    for u in unknown})
    torch_eps = sorted({u.torch_eps for u in unknown})
    default = unknown[0].keras_default
    verb = "defaults" if len(kinds) == 1 else "default"
    note = (f"The weights file does not record normalization epsilon: Keras' {' and '.join(kinds)} {verb} to "
            f"epsilon={default:g} (keras.io layer docs), while PyTorch {', '.join(cap_items(names, 4))} "
            f"use{'s' if len(names) == 1 else ''} eps={'/'.join(f'{e:g}' for e in torch_eps)} (PyTorch's default)")
    effects = [(u.relative_effect, u.torch_name) for u in unknown if u.relative_effect is not None]
    if effects:
        effect, where = max(effects)
        note += (f"; if the Keras model kept its default, the normalized output of `{where}` is off by up "
                 f"to {effect:.1e} relatively (from its stored moving variance)")
    evidence = {"epsilon_unknown": {u.torch_name: {"keras_layer": u.keras_name, "torch_eps": u.torch_eps,
                                                    "keras_default_epsilon": u.keras_default,
                                                    "relative_effect": u.relative_effect} for u in unknown}}
    fix = (f"if the Keras model used the default, build {', '.join(cap_items(names, 4))} with eps={default:g}; "
           f"give --keras-model MODULE:CALLABLE so epsilon is read from the model and outputs are compared")
    return note + ".", evidence, fix


def run(args: argparse.Namespace) -> int:
    from nndoctor.commands.ckpt.cli import finish
    from nndoctor.commands.ckpt.model_spec import build_torch_model

    check_output_path(args.output, [args.source])
    from nndoctor.commands.ckpt.analysis import safety_findings
    from nndoctor.commands.ckpt.cli import unreadable_but_unsafe

    ckpt = read_checkpoint(args.source)
    if ckpt.unsafe_globals and not ckpt.format.startswith("keras"):
        return unreadable_but_unsafe(ckpt, ["ckpt", "convert", args.source, "-o", args.output], args)
    tensorflow = ckpt.format.startswith("tf-")
    if tensorflow and not ckpt.keras_layers:
        raise UsageError(f"{args.source}: a TensorFlow {ckpt.format[3:]} whose variables are not Keras layers "
                         f"(no layer/variable paths such as sequential/dense/kernel): nothing to pair with "
                         f"PyTorch modules")
    if not ckpt.format.startswith("keras") and not tensorflow:
        raise UsageError(f"{args.source}: convert takes Keras files (.keras, .h5, .weights.h5), TensorFlow "
                         f"checkpoints and SavedModels; this is {ckpt.format} — use 'nndoctor ckpt fix' "
                         f"for PyTorch checkpoints")
    model = build_torch_model(args.model)
    report = Report(command=["ckpt", "convert", args.source, "-o", args.output])
    for finding in safety_findings(ckpt):  # pickles hidden in HDF5 attributes
        report.add(finding)
    location = Location(args.source)
    keras_model = None
    if not args.no_verify:
        from nndoctor.commands.ckpt.keras_runtime import (
            keras_model_from_variables,
            live_layers,
            load_keras_model,
        )

        if tensorflow:  # the SavedModel's own graph is never run: the Keras model is the user's
            keras_model = (keras_model_from_variables(args.keras_model, ckpt.keras_layers, args.source)
                           if args.keras_model else None)
        else:
            full = ckpt.format == "keras-zip" or bool(ckpt.metadata.get("keras_model_class"))
            keras_model = load_keras_model(args.source, args.keras_model, full_model=full)
    layers = ckpt.keras_layers
    if keras_model is not None:
        layers = live_layers(keras_model)  # names, configs and Flatten shapes from the model
    plan = plan_conversion(layers, model)
    log = [f"{k} ({kind}) → {t}" for k, kind, t in plan.pairs]

    state = model.state_dict()
    unfilled = [k for k, v in state.items() if k not in plan.tensors and not k.endswith("num_batches_tracked")]
    problems = plan.errors + [f"Keras layer {n} has no PyTorch module" for n in plan.unused_keras]
    problems += [f"PyTorch {n} got no weights" for n in plan.unfilled_torch]
    if problems or unfilled:
        report.add(checks.UnconvertedWeights.finding(
            f"{len(problems) or len(unfilled)} problem(s): " + "; ".join(problems[:6] or unfilled[:6]),
            location=location, evidence={"problems": problems, "unfilled_parameters": unfilled}))
    for keras_name, torch_name, keras_eps, torch_eps in plan.epsilon_mismatches:
        report.add(checks.NormalizationEpsilonMismatch.finding(
            f"Keras layer {keras_name} uses epsilon={keras_eps:g}, PyTorch {torch_name} eps={torch_eps:g}",
            location=Location(args.source, None), evidence={"keras": keras_name, "torch": torch_name,
                                                            "keras_epsilon": keras_eps, "torch_eps": torch_eps},
            fix=f"construct {torch_name} with eps={keras_eps:g}"))
    converted = dict(state)
    converted.update({k: v.to(state[k].dtype) for k, v in plan.tensors.items() if k in state})
    verification = None
    if not problems and not unfilled:
        model.load_state_dict(converted, strict=True)
        if keras_model is not None:
            from nndoctor.commands.ckpt.keras_runtime import compare_outputs

            verification = compare_outputs(keras_model, model, layers, input_layout=args.input_layout)
            diff = verification["max_abs_diff"]
            if not diff <= args.atol:
                report.add(checks.ConversionOutputMismatch.finding(
                    f"max |PyTorch − Keras| = {diff:.3g} > {args.atol:g} on input "
                    f"{verification['input_shape']} (outputs {verification['keras_output_shape']} vs "
                    f"{verification['torch_output_shape']})", location=location, evidence=verification))
            log.append(f"verified: max |PyTorch − Keras| = {diff:.3g} on a random input "
                       f"{verification['input_shape']} ({verification['input_layout']} for PyTorch)")
        else:
            why = ("--no-verify given" if args.no_verify else
                   "a TensorFlow checkpoint and no --keras-model" if tensorflow else
                   "a weights-only file and no --keras-model")
            message = (f"outputs were not compared ({why}); shapes fit, but Flatten order, padding or "
                       f"activations may still differ")
            evidence: dict[str, Any] = {}
            fix: str | None = None
            if plan.epsilon_unknown:
                note, evidence, fix = unknown_epsilon_note(plan.epsilon_unknown)
                message += ". " + note
            report.add(checks.ConversionNotVerified.finding(message, location=location,
                                                           evidence=evidence or None, fix=fix))
    written = not any(f.code in ("C206", "C207") for f in report.findings)
    if written:
        write_state_dict(args.output, converted, metadata={"source": args.source,
                                                          "written_by": "nndoctor ckpt convert"})
        log.append(f"wrote {len(converted)} tensors to {args.output}")
    else:
        log.append("NOT written (see findings)")
    if getattr(args, "json", None) != "-":
        from nndoctor.report.terminal import no_color_options

        console = Console(file=sys.stdout, highlight=False, **no_color_options())
        console.print(f"[bold]convert[/bold] {escape(args.source)} → {escape(args.output)}")
        for line in log:
            console.print(f"  {escape(line)}")
        console.print()
    report.extra["convert"] = {"pairs": [list(p) for p in plan.pairs], "verification": verification,
                               "written": written, "actions": log}
    code = finish(report, args)
    return code if written else max(code, 1)
