"""Words and numbers for displays: P that never rounds across the threshold, and the report's headline.

* :func:`format_P` — P with as many decimals as it takes to stay on its side of the
  threshold (0.8998 at threshold 0.9 prints ``0.8998``, never ``0.900``).
* :func:`headline` — one sentence that leads a report: the model, what weights were
  measured, how many heads closed, and against what null.
* :func:`summary_sections` — a report's summary as readable (key, value) tables.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["format_P", "headline", "summary_sections", "weights_phrase"]


def format_P(P: float, threshold: float | None = None, digits: int = 4) -> str:
    """``P`` with ``digits`` decimals, or more when fewer would round it across ``threshold``.

    NaN prints as ``"undefined"``.
    """
    if P is None or (isinstance(P, float) and math.isnan(P)):
        return "undefined"
    P = float(P)
    d = digits
    while d < 17:
        text = f"{P:.{d}f}"
        if threshold is None or (float(text) >= threshold) == (P >= threshold):
            return text
        d += 1
    return repr(P)  # pragma: no cover


def weights_phrase(summary: dict[str, Any]) -> str:
    """What weights were measured, in words (SPEC 10)."""
    proc = summary.get("processing") or {}
    if proc.get("raw", True):
        what = "raw checkpoint weights"
    else:
        flags = [k for k in ("fold_ln", "center_writing_weights", "fold_value_biases") if proc.get(k)]
        what = "TransformerLens-processed weights (" + ", ".join(flags) + ")" if flags else "processed weights"
    src = proc.get("source") or (summary.get("source") or {}).get("format")
    return f"{what}" + (f", read via {src}" if src else "")


def headline(summary: dict[str, Any], threshold: float) -> str:
    """One sentence: model, weights, closed heads, and the null they were measured against."""
    s = summary
    n, k = int(s["n_heads"]), int(s["n_closed"])
    pct = 100.0 * k / n if n else float("nan")
    text = (
        f"{s['model_name']} ({s['model_class']}, {weights_phrase(s)}): {k} of {n} heads ({pct:.2f} %) are "
        f"near-idempotent, P ≥ {threshold:g}; median P {s['median_P']:.3g}."
    )
    if "median_P_scrambled" in s:
        text += (
            f" Against the orientation-scramble null ({s['n_scramble_draws']} Haar draws per head) "
            f"{100 * s['frac_beats_scramble']:.2f} % of heads beat their scramble median (median scrambled P "
            f"{s['median_P_scrambled']:.3g})"
        )
        if s.get("n_mismatch_pairs"):
            text += (
                f", and {s['n_mismatch_closed']} of {s['n_mismatch_pairs']} matched O/V mismatch pairs reach "
                f"P ≥ {threshold:g}."
            )
        else:
            text += "; there is no matched O/V mismatch pair (one kv head)."
    else:
        text += (
            " No null control was run (nulls=0): use nulls=64 (CLI --nulls 64) for the scramble and mismatch controls."
        )
    if "n_feasible_layers" in s:
        n_layers = int(s.get("n_attention_layers", 0))
        text += f" Constructive search: P ≥ {threshold:g} is feasible in {s['n_feasible_layers']} of {n_layers} layers."
    return text


def summary_sections(summary: dict[str, Any]) -> list[tuple[str, list[tuple[str, str]]]]:
    """A summary as titled (key, value) tables: what was measured, processing, options, versions, source."""

    def fmt(v: Any) -> str:
        if isinstance(v, float):
            return "NaN" if math.isnan(v) else f"{v:.6g}"
        if isinstance(v, (list, tuple)):
            return ", ".join(fmt(x) for x in v) if v else "(none)"
        if isinstance(v, dict):
            return "; ".join(f"{a}: {fmt(b)}" for a, b in v.items())
        return str(v)

    s = summary
    measured: list[tuple[str, str]] = [
        (k, fmt(s[k]))
        for k in (
            "model_name",
            "model_class",
            "n_layers",
            "n_attention_layers",
            "n_heads",
            "n_heads_per_layer",
            "n_kv_heads",
            "d_model",
            "d_head",
            "threshold",
            "weights_fingerprint",
        )
        if k in s
    ]
    headline_keys = [
        k
        for k in s
        if k not in {m for m, _ in measured} and not isinstance(s[k], dict) and k not in ("closed_per_layer",)
    ]
    out: list[tuple[str, list[tuple[str, str]]]] = [
        ("What was measured", measured),
        ("Headline numbers", [(k, fmt(s[k])) for k in headline_keys]),
    ]
    for title, key in (
        ("Weights: processing flags (SPEC 10)", "processing"),
        ("Options", "options"),
        ("Source", "source"),
        ("Shared-value algebra", "algebra"),
        ("Versions", "versions"),
    ):
        if isinstance(s.get(key), dict) and s[key]:
            out.append((title, [(k, fmt(v)) for k, v in s[key].items()]))
    return out
