"""The general options' defaults live once (core/defaults.py): the report's options, the command line and
every public standalone function taking ``threshold``, ``compute_dtype`` or ``device`` show the same value."""

from __future__ import annotations

import inspect

import torch

import tl_idempotence as tli
from tl_idempotence.analyses.report_options import ReportOptions
from tl_idempotence.cli.parser import build_parser
from tl_idempotence.core.defaults import DEFAULT_COMPUTE_DTYPE, DEFAULT_DEVICE, DEFAULT_THRESHOLD
from tl_idempotence.core.option_specs import GENERAL_OPTIONS
from tl_idempotence.core.options import check_compute_dtype

DEFAULTS = {"threshold": DEFAULT_THRESHOLD, "compute_dtype": DEFAULT_COMPUTE_DTYPE, "device": DEFAULT_DEVICE}


def _public_defaults() -> dict[tuple[str, str], object]:
    """``{(entry point, parameter): default}`` over ``tli.__all__``'s functions and the public methods of its
    classes, for the general options' parameters that have a default (``None`` means "from elsewhere")."""
    found: dict[tuple[str, str], object] = {}

    def visit(qual: str, f: object) -> None:
        try:
            sig = inspect.signature(f)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            return
        for name in DEFAULTS:
            p = sig.parameters.get(name)
            if p is not None and p.default is not inspect.Parameter.empty and p.default is not None:
                found[(qual, name)] = p.default

    for name in tli.__all__:
        obj = getattr(tli, name)
        if inspect.isclass(obj):
            for m, v in vars(obj).items():
                if not m.startswith("_") and callable(v):
                    visit(f"{name}.{m}", getattr(obj, m))
        elif callable(obj):
            visit(name, obj)
    return found


def test_every_public_default_is_the_one_constant():
    found = _public_defaults()
    # the six standalone functions are found (the test cannot pass by finding nothing)
    for f in ("closure", "orientation_scramble", "mismatch", "constructive_search", "shared_value_algebra"):
        assert (f, "compute_dtype") in found and (f, "device") in found
    for f in ("mismatch", "constructive_search", "shared_value_algebra", "activation_returns"):
        assert (f, "threshold") in found
    wrong = {k: v for k, v in found.items() if v != DEFAULTS[k[1]]}
    assert wrong == {}


def test_the_report_options_and_the_command_line_read_the_same_defaults():
    specs = {o.name: o.default for o in GENERAL_OPTIONS}
    assert {k: specs[k] for k in DEFAULTS} == DEFAULTS
    opts = ReportOptions()
    assert opts.threshold == DEFAULT_THRESHOLD == 0.9
    assert check_compute_dtype(opts.compute_dtype) is check_compute_dtype(DEFAULT_COMPUTE_DTYPE) is torch.float64
    assert str(opts.device) == DEFAULT_DEVICE == "cpu"
    args = build_parser().parse_args(["report", "some-model"])
    assert args.threshold == DEFAULT_THRESHOLD
