"""Closure of every head across training checkpoints (SPEC section 6).

:func:`trajectory` runs :func:`~tl_idempotence.report.idempotence_report` on an
ordered list of checkpoints — loading ONE checkpoint at a time, measuring it,
dropping it and collecting garbage before the next is loaded, so memory is
bounded by one checkpoint — and returns a long table (one row per checkpoint ×
head) plus figures that track the heads closed at the end back through training,
next to their layer's feasible P (the constructive search's capacity, SPEC 5)
and their orientation-scramble null (SPEC 4b). That is what separates
"capacity was available early" (feasible P high from the start) from
"orientation was attained late" (P rises towards it only later).

A checkpoint can be given as

* a TransformerLens model (or any object ``idempotence_report`` accepts) — already
  resident, so it is not loaded or dropped by this function;
* a path to a checkpoint directory / ``.safetensors`` / ``.gguf`` file (read
  layer by layer by :mod:`tl_idempotence.sources`);
* ``(model_name, {"checkpoint_index": i})`` or ``{"checkpoint_value": v}`` —
  TransformerLens's published-lineage route (Pythia, ...) through
  ``TransformerBridge.boot_transformers``; this one needs the Hugging Face hub;
* a zero-argument callable returning a model (your own loader).

Results can be cached per checkpoint (``cache_dir``): one parquet file (CSV
without pyarrow) per checkpoint, keyed by its label, the analysis options and a
fingerprint of its files, so re-running a trajectory after adding checkpoints or
changing the plot only measures what is new.
"""

from __future__ import annotations

import gc
import hashlib
import json
import os
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

__all__ = ["Trajectory", "trajectory"]

#: Bump when the cached table layout changes.
CACHE_VERSION = 1
_HUB_KEYS = {"checkpoint_index", "checkpoint_value", "revision"}
_WEIGHT_SUFFIXES = {".safetensors", ".bin", ".gguf", ".json", ".pt", ".pth"}


# --------------------------------------------------------------------------------------------
# Checkpoint specs
# --------------------------------------------------------------------------------------------


@dataclass
class _Ckpt:
    order: int
    label: str
    spec: Any
    kind: str  # "object" | "path" | "hub" | "callable"
    step: float


def _is_model_object(x: Any) -> bool:
    from .heads import HeadSource, _is_tl_model

    if _is_tl_model(x) or isinstance(x, HeadSource):
        return True
    try:
        import torch

        return isinstance(x, torch.nn.Module)
    except ImportError:  # pragma: no cover
        return False


def _is_module(x: Any) -> bool:
    try:
        import torch

        return isinstance(x, torch.nn.Module)
    except ImportError:  # pragma: no cover
        return False


def _kind(label: str, spec: Any) -> str:
    if isinstance(spec, (str, os.PathLike)):
        p = Path(spec).expanduser()
        if not p.exists():
            raise FileNotFoundError(
                f"Checkpoint {label!r}: {str(spec)!r} does not exist. Pass an existing checkpoint directory or file "
                "(nothing is downloaded for paths)."
            )
        return "path"
    if _is_model_object(spec):
        return "object"
    if isinstance(spec, tuple) and len(spec) == 2 and isinstance(spec[0], str) and isinstance(spec[1], dict):
        bad = set(spec[1]) - _HUB_KEYS
        if bad or not spec[1]:
            raise ValueError(
                f"Checkpoint {label!r}: a (model_name, options) checkpoint takes options from {sorted(_HUB_KEYS)}, "
                f"e.g. ('EleutherAI/pythia-70m', {{'checkpoint_index': 3}}); got {spec[1]!r}."
            )
        return "hub"
    if callable(spec):
        return "callable"
    raise TypeError(
        f"Checkpoint {label!r}: cannot load a {type(spec).__name__}. Give a TransformerLens model, a path to a "
        "checkpoint directory/file, (model_name, {'checkpoint_index': i}), or a zero-argument callable returning a model."
    )


def _step_of(label: Any, spec: Any) -> float:
    if isinstance(label, (int, np.integer)):
        return float(label)
    m = re.search(r"(\d+)\D*$", str(label))
    if m:
        return float(m.group(1))
    if isinstance(spec, tuple) and len(spec) == 2 and isinstance(spec[1], dict) and "checkpoint_value" in spec[1]:
        return float(spec[1]["checkpoint_value"])
    return float("nan")


def _normalize(checkpoints: Any) -> list[_Ckpt]:
    from .lineage import Lineage, lineage_checkpoints

    if isinstance(checkpoints, Lineage):
        checkpoints = checkpoints.checkpoints
    elif isinstance(checkpoints, (str, os.PathLike)):
        checkpoints = lineage_checkpoints(checkpoints)
    if isinstance(checkpoints, dict):
        checkpoints = list(checkpoints.items())
    if not isinstance(checkpoints, Sequence) or isinstance(checkpoints, (str, bytes)):
        raise TypeError(
            "checkpoints must be an ordered sequence of (label, model-or-path) pairs (or (label, spec, step) triples), "
            f"a lineage directory or a Lineage; got {type(checkpoints).__name__}."
        )
    if len(checkpoints) == 0:
        raise ValueError("checkpoints is empty: give at least one (label, model-or-path) pair.")
    out: list[_Ckpt] = []
    for i, entry in enumerate(checkpoints):
        if not isinstance(entry, (tuple, list)) or len(entry) not in (2, 3):
            raise TypeError(
                f"checkpoints[{i}] must be a (label, model-or-path) pair or (label, spec, step) triple; got {entry!r:.80}."
            )
        label, spec = entry[0], entry[1]
        step = float(entry[2]) if len(entry) == 3 else _step_of(label, spec)
        out.append(_Ckpt(order=i, label=str(label), spec=spec, kind=_kind(str(label), spec), step=step))
    labels = [c.label for c in out]
    dup = sorted({l for l in labels if labels.count(l) > 1})
    if dup:
        raise ValueError(f"Checkpoint labels must be unique; repeated: {dup}.")
    return out


def _load_hub(name: str, options: dict[str, Any]) -> Any:
    """``TransformerBridge.boot_transformers(name, checkpoint_index=...)`` with a clear offline error."""
    from transformer_lens.model_bridge import TransformerBridge

    try:
        return TransformerBridge.boot_transformers(name, device="cpu", **options)
    except OSError as e:
        offline = any(os.environ.get(v, "").strip().lower() in ("1", "true", "yes") for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))
        raise OSError(
            f"Could not load {name!r} with {options}: published training checkpoints are downloaded from the Hugging Face "
            f"hub{' and HF_HUB_OFFLINE/TRANSFORMERS_OFFLINE is set' if offline else ' and it could not be reached'}. "
            "Download the checkpoints once (e.g. huggingface_hub.snapshot_download(name, revision='step1000')) and pass "
            f"their local directories instead. Original error: {e}"
        ) from e


def _fingerprint(c: _Ckpt) -> dict[str, Any] | None:
    """What identifies a checkpoint's weights for the cache, or None when it cannot be known without loading."""
    if c.kind == "hub":
        return {"hub": c.spec[0], **{k: c.spec[1][k] for k in sorted(c.spec[1])}}
    if c.kind != "path":
        return None
    p = Path(c.spec).expanduser().resolve()
    files = [p] if p.is_file() else sorted(f for f in p.iterdir() if f.is_file() and f.suffix in _WEIGHT_SUFFIXES)
    return {"path": str(p), "files": [[f.name, f.stat().st_size, f.stat().st_mtime_ns] for f in files]}


def _slug(label: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", label)[:60] or "ckpt"


class _Cache:
    def __init__(self, root: str | os.PathLike | None):
        self.root = None if root is None else Path(root)
        if self.root is not None:
            self.root.mkdir(parents=True, exist_ok=True)
        try:
            import pyarrow  # noqa: F401

            self.ext = "parquet"
        except ImportError:  # pragma: no cover - pyarrow is in the test extra
            self.ext = "csv"

    def paths(self, key: str, label: str) -> tuple[Path, Path]:
        stem = self.root / f"{_slug(label)}-{key[:20]}"
        return stem.with_suffix(f".heads.{self.ext}"), stem.with_suffix(f".layers.{self.ext}")

    def read(self, key: str, label: str) -> tuple[pd.DataFrame, pd.DataFrame] | None:
        if self.root is None:
            return None
        ph, pl = self.paths(key, label)
        if not (ph.is_file() and pl.is_file()):
            return None
        rd = pd.read_parquet if self.ext == "parquet" else pd.read_csv
        return rd(ph), rd(pl)

    def write(self, key: str, label: str, heads: pd.DataFrame, layers: pd.DataFrame) -> None:
        if self.root is None:
            return
        for df, path in zip((heads, layers), self.paths(key, label)):
            tmp = path.with_name(path.name + f".tmp{os.getpid()}")
            if self.ext == "parquet":
                df.to_parquet(tmp, index=False)
            else:
                df.to_csv(tmp, index=False)
            os.replace(tmp, path)


# --------------------------------------------------------------------------------------------
# Result
# --------------------------------------------------------------------------------------------


@dataclass
class Trajectory:
    """Result of :func:`trajectory`.

    Attributes:
        heads: long table, one row per (checkpoint, layer, head): ``checkpoint`` (label),
            ``order`` (position in the input), ``step`` (training step parsed from the
            label, NaN if unknown), then every column of the report's ``heads`` table
            (``layer, head, kv_head, alpha, P, closed, ...``; with ``nulls`` the scramble
            columns incl. ``P_scrambled_median``) and, with ``search``, ``feasible_P``
            (the head's layer's feasible P, unless the search reports a per-head value)
            and ``layer_feasible_P``.
        layers: one row per (checkpoint, layer) with the report's ``layers`` columns
            (``n_closed, median_P, max_P``; with nulls ``median_P_scrambled``; with
            search ``feasible_P``).
        checkpoints: one row per checkpoint: ``order, checkpoint, step, kind, cached,
            seconds`` (wall time to load and measure, 0 when cached), ``n_heads,
            n_closed, median_P`` (and ``median_P_scrambled`` with nulls).
        threshold: P threshold of "closed" (paper: 0.9).
        options: the analysis options (nulls, seed, search, layers, heads).
    """

    heads: pd.DataFrame
    layers: pd.DataFrame
    checkpoints: pd.DataFrame
    threshold: float
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def final_label(self) -> str:
        """Label of the last checkpoint (the one "final-closed" refers to)."""
        return str(self.checkpoints.sort_values("order")["checkpoint"].iloc[-1])

    def final(self) -> pd.DataFrame:
        """Rows of :attr:`heads` at the last checkpoint."""
        return self.heads[self.heads["checkpoint"] == self.final_label]

    def tracked_heads(self, top_k: int = 5) -> pd.DataFrame:
        """The heads the figures follow: ``layer, head, final_P, why``.

        The heads with final ``P >= threshold`` (``why = "final P >= threshold"``), or —
        if none closed — the ``top_k`` heads by final P (``why = "top-k by final P (none closed)"``).
        When ``heads=`` was given to :func:`trajectory`, exactly those heads.
        """
        fin = self.final().dropna(subset=["P"]).sort_values("P", ascending=False)
        if self.options.get("heads"):
            sel, why = fin, "selected"
        else:
            closed = fin[fin["P"] >= self.threshold]
            sel, why = (closed, "final P >= threshold") if len(closed) else (fin.head(top_k), "top-k by final P (none closed)")
        out = sel[["layer", "head", "P"]].rename(columns={"P": "final_P"}).reset_index(drop=True)
        out["why"] = why
        return out

    def wide(self, value: str = "P") -> pd.DataFrame:
        """``value`` as a (layer, head) x checkpoint table, checkpoints in input order."""
        order = self.checkpoints.sort_values("order")["checkpoint"].tolist()
        w = self.heads.pivot_table(index=["layer", "head"], columns="checkpoint", values=value, sort=False)
        return w[[c for c in order if c in w.columns]]

    def _x(self) -> tuple[str, str]:
        return ("step", "training step") if self.heads["step"].notna().all() else ("order", "checkpoint")

    def figure(self, top_k: int = 5, log_y: bool = True):
        """P over training for the tracked heads (:meth:`tracked_heads`), one panel per layer.

        Each head's P is a solid line; its scramble-null median (``nulls``) the same colour
        dotted; with ``search`` its own searched P the same colour long-dashed and the layer's
        feasible P (best searched P in the layer) a black dashed line; the threshold a grey line. ``log_y`` (default) shows P from the null level (~1e-4) up to 1.
        """
        import plotly.graph_objects as go
        from plotly.colors import qualitative
        from plotly.subplots import make_subplots

        tr = self.tracked_heads(top_k=top_k)
        xcol, xtitle = self._x()
        layers = sorted(tr["layer"].unique().tolist())
        why = tr["why"].iloc[0] if len(tr) else "no heads"
        if tr.empty:
            fig = go.Figure()
            fig.update_layout(title="No head has a defined P at the final checkpoint")
            return fig
        fig = make_subplots(
            rows=len(layers), cols=1, shared_xaxes=True, vertical_spacing=min(0.08, 0.3 / max(len(layers), 1)),
            subplot_titles=[f"layer {l}" for l in layers],
        )
        colors = qualitative.Plotly
        lay = self.layers.sort_values("order")
        for i, (layer, head) in enumerate(zip(tr["layer"], tr["head"])):
            row = layers.index(layer) + 1
            d = self.heads[(self.heads["layer"] == layer) & (self.heads["head"] == head)].sort_values("order")
            color = colors[i % len(colors)]
            name = f"L{layer}H{head}"
            fig.add_trace(
                go.Scatter(x=d[xcol], y=d["P"], mode="lines+markers", name=f"{name} P", legendgroup=name,
                           line=dict(color=color), customdata=np.stack([d["checkpoint"], d["alpha"]], -1),
                           hovertemplate=f"{name}<br>%{{customdata[0]}}<br>P=%{{y:.4g}}<br>α=%{{customdata[1]:.4g}}<extra></extra>"),
                row=row, col=1,
            )
            if "P_searched" in d and d["P_searched"].notna().any():
                fig.add_trace(
                    go.Scatter(x=d[xcol], y=d["P_searched"], mode="lines", name=f"{name} searched P",
                               legendgroup=name, line=dict(color=color, dash="longdash", width=1)),
                    row=row, col=1,
                )
            if "P_scrambled_median" in d:
                fig.add_trace(
                    go.Scatter(x=d[xcol], y=d["P_scrambled_median"], mode="lines", name=f"{name} scramble median",
                               legendgroup=name, line=dict(color=color, dash="dot")),
                    row=row, col=1,
                )
        for layer in layers:
            row = layers.index(layer) + 1
            ld = lay[lay["layer"] == layer]
            if "feasible_P" in ld and ld["feasible_P"].notna().any():
                fig.add_trace(
                    go.Scatter(x=ld[xcol], y=ld["feasible_P"], mode="lines", name=f"layer {layer} feasible P (search)",
                               line=dict(color="black", dash="dash")),
                    row=row, col=1,
                )
            fig.add_hline(y=self.threshold, line=dict(color="grey", width=1, dash="dashdot"), row=row, col=1)
        fig.update_yaxes(title_text="P", type="log" if log_y else "linear")
        fig.update_xaxes(title_text=xtitle, row=len(layers), col=1)
        head_note = f"heads with final P ≥ {self.threshold}" if why == "final P >= threshold" else (
            f"NO head reached P ≥ {self.threshold}: top {len(tr)} heads by final P" if why.startswith("top") else "selected heads")
        fig.update_layout(
            title=f"Closure over training — {head_note}; dotted: scramble null, dashed: layer feasible P",
            height=260 * len(layers) + 120, template="plotly_white",
        )
        return fig

    def summary_figure(self, log_y: bool = True):
        """Per checkpoint: median P over all heads, fraction closed, and (nulls) median scrambled P."""
        import plotly.graph_objects as go

        ck = self.checkpoints.sort_values("order")
        xcol, xtitle = self._x()
        fig = go.Figure()
        fig.add_trace(go.Scatter(x=ck[xcol], y=ck["median_P"], mode="lines+markers", name="median P (all heads)"))
        fig.add_trace(go.Scatter(x=ck[xcol], y=ck["n_closed"] / ck["n_heads"], mode="lines+markers",
                                 name=f"fraction with P ≥ {self.threshold}"))
        if "median_P_scrambled" in ck:
            fig.add_trace(go.Scatter(x=ck[xcol], y=ck["median_P_scrambled"], mode="lines", name="median scrambled P",
                                     line=dict(dash="dot")))
        fig.update_layout(title="All heads over training", xaxis_title=xtitle, yaxis_title="P / fraction",
                          yaxis_type="log" if log_y else "linear", template="plotly_white")
        return fig

    def figures(self, top_k: int = 5) -> list:
        """``[figure(), summary_figure()]``."""
        return [self.figure(top_k=top_k), self.summary_figure()]

    def _repr_html_(self) -> str:  # notebooks
        tr = self.tracked_heads()
        return (
            f"<b>Trajectory</b> over {len(self.checkpoints)} checkpoints ({self.checkpoints['checkpoint'].iloc[0]} … "
            f"{self.final_label}); {int((tr['why'] == 'final P >= threshold').sum())} heads closed at the end."
        )


# --------------------------------------------------------------------------------------------
# The function
# --------------------------------------------------------------------------------------------


def _measure(model: Any, threshold: float, nulls: Any, seed: int, search: bool, layers: list[int] | None,
             report_kwargs: dict[str, Any]) -> tuple[pd.DataFrame, pd.DataFrame]:
    from .report import idempotence_report

    rep = idempotence_report(model, threshold, nulls=nulls, seed=seed, search=search, layers=layers, progress=False,
                             **report_kwargs)
    heads, lay = rep.heads.copy(), rep.layers.copy()
    rep.model = None  # the report must not keep the checkpoint alive
    del rep
    return heads, lay


def _load(c: _Ckpt, loader: Callable[[Any], Any] | None) -> Any:
    if c.kind == "callable":
        return c.spec()
    if c.kind == "hub":
        return loader(c.spec) if loader is not None else _load_hub(*c.spec)
    if c.kind == "path":
        if loader is not None:
            return loader(c.spec)
        try:
            from .heads import head_source

            return head_source(c.spec)  # streams the file layer by layer (tl_idempotence.sources)
        except TypeError:  # no file source for this path: boot it with TransformerBridge
            from .testing import bridge_from_dir

            return bridge_from_dir(c.spec)
    return c.spec


def trajectory(
    checkpoints: Any,
    heads: Sequence[tuple[int, int]] | None = None,
    *,
    threshold: float = 0.9,
    nulls: bool | int = False,
    search: bool = False,
    seed: int = 0,
    layers: Sequence[int] | None = None,
    cache_dir: str | os.PathLike | None = None,
    loader: Callable[[Any], Any] | None = None,
    progress: bool = True,
    **report_kwargs: Any,
) -> Trajectory:
    """Per-head closure across an ordered list of training checkpoints (SPEC section 6).

    Each checkpoint is loaded, measured with :func:`~tl_idempotence.idempotence_report`
    (same options for all), and dropped (``del``, and :func:`gc.collect` for a loaded
    ``nn.Module``, whose reference cycles would otherwise keep it alive) before the next
    one is loaded: at most one checkpoint loaded by this function is resident at a time.

    Args:
        checkpoints: ordered ``[(label, spec)]`` or ``[(label, spec, step)]`` where ``spec``
            is a TransformerLens model, a path (checkpoint directory, ``.safetensors``,
            ``.gguf``), ``(model_name, {"checkpoint_index": i})`` /
            ``{"checkpoint_value": v}`` (downloads through
            ``TransformerBridge.boot_transformers``: needs the hub), or a zero-argument
            callable returning a model. Also accepted: a lineage directory of
            ``ckpt_step{N}`` dirs or a :class:`~tl_idempotence.lineage.Lineage`. The step
            of a pair is parsed from the label's last number (``"step1000"`` -> 1000) or the
            ``checkpoint_value``; NaN if neither (figures then use the order).
        heads: ``[(layer, head)]`` to keep (default: all heads); only their layers are measured.
        threshold: P threshold of a "closed" head (paper: 0.9).
        nulls: orientation-scramble draws per head (``True`` = 64), adds ``P_scrambled_median``.
        search: run the constructive search (adds the layer's ``feasible_P``; slow).
        seed: seed of the nulls and the search (the same for every checkpoint).
        layers: restrict to these layer indices.
        cache_dir: directory for per-checkpoint result files (parquet, CSV without
            pyarrow), keyed by label, options and a fingerprint of the checkpoint files
            (names, sizes, modification times) or of the hub name + index. Model objects
            and callables are never cached (their weights cannot be fingerprinted before loading).
        loader: ``loader(spec) -> model`` used instead of the built-in loading for path and
            hub checkpoints (e.g. ``tl_idempotence.testing.bridge_from_dir``).
        progress: tqdm bar over checkpoints.
        **report_kwargs: passed to :func:`~tl_idempotence.idempotence_report` (e.g. ``compute_dtype``).

    Returns:
        :class:`Trajectory` (``.heads`` long table, ``.layers``, ``.checkpoints``, ``.figure()``).

    Raises:
        TypeError: ``checkpoints`` is not a sequence of pairs, or a spec of unknown type.
        ValueError: empty or duplicate labels, bad hub options, bad threshold/layers (from the report),
            a ``heads`` entry that is not a head of the measured model.
        FileNotFoundError: a checkpoint path that does not exist.
        OSError: a hub checkpoint that cannot be downloaded (offline); the message says what to do.
    """
    if not (0.0 <= float(threshold) <= 1.0):
        raise ValueError(f"threshold must be in [0, 1] (P is a squared cosine); got {threshold}.")
    ckpts = _normalize(checkpoints)
    head_set: list[tuple[int, int]] | None = None
    if heads is not None:
        try:
            head_set = sorted({(int(l), int(h)) for l, h in heads})
        except (TypeError, ValueError) as e:
            raise TypeError(f"heads must be a sequence of (layer, head) integer pairs; got {heads!r:.80}.") from e
        if not head_set:
            raise ValueError("heads is empty; pass None for all heads.")
    run_layers: list[int] | None = None if layers is None else sorted({int(l) for l in layers})
    if head_set is not None:
        hl = sorted({l for l, _ in head_set})
        if run_layers is not None:
            missing = sorted(set(hl) - set(run_layers))
            if missing:
                raise ValueError(f"heads name layers {missing} that are not in layers={run_layers}.")
        run_layers = hl
    n_draws = 64 if nulls is True else int(nulls or 0)
    options = {"threshold": float(threshold), "nulls": n_draws, "seed": int(seed), "search": bool(search),
               "layers": run_layers, "heads": head_set,
               "report_kwargs": {k: str(v) for k, v in sorted(report_kwargs.items())}}
    cache = _Cache(cache_dir)
    from . import __version__

    head_tables, layer_tables, rows = [], [], []
    bar = tqdm(ckpts, desc="checkpoints", unit="ckpt", disable=not progress)
    for c in bar:
        bar.set_postfix_str(c.label)
        t0 = time.perf_counter()
        fp = _fingerprint(c)
        key = None
        if fp is not None and cache.root is not None:
            payload = {"v": CACHE_VERSION, "pkg": __version__, "label": c.label, "fingerprint": fp,
                       **{k: v for k, v in options.items() if k != "heads"}}
            key = hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()
        hit = cache.read(key, c.label) if key is not None else None
        if hit is not None:
            hd, ld = hit
        else:
            model = _load(c, loader)
            # a loaded model (nn.Module) usually sits in reference cycles (hooks, parent links): collect
            # them before the next checkpoint; a file source holds no weights between layers.
            collect = c.kind != "object" and _is_module(model)
            try:
                hd, ld = _measure(model, threshold, n_draws, seed, search, run_layers, report_kwargs)
            finally:
                del model  # drop our reference before the next checkpoint is loaded
                if collect:
                    gc.collect()
            if key is not None:
                cache.write(key, c.label, hd, ld)
        seconds = 0.0 if hit is not None else time.perf_counter() - t0
        if head_set is not None:
            have = set(zip(hd["layer"].astype(int), hd["head"].astype(int)))
            absent = [lh for lh in head_set if lh not in have]
            if absent:
                raise ValueError(f"Checkpoint {c.label!r} has no heads {absent[:10]} (layer, head).")
            keep = [(int(l), int(h)) in set(head_set) for l, h in zip(hd["layer"], hd["head"])]
            hd = hd[keep]
        if "feasible_P" in ld:
            lf = ld.set_index("layer")["feasible_P"]
            if "feasible_P" not in hd:
                hd = hd.assign(feasible_P=hd["layer"].map(lf).to_numpy())
            hd = hd.assign(layer_feasible_P=hd["layer"].map(lf).to_numpy())
        meta = {"checkpoint": c.label, "order": c.order, "step": c.step}
        hd = hd.assign(**meta)
        ld = ld.assign(**meta)
        head_tables.append(hd)
        layer_tables.append(ld)
        P = hd["P"].to_numpy(dtype=float)
        row = {**meta, "kind": c.kind, "cached": hit is not None, "seconds": seconds, "n_heads": len(hd),
               "n_closed": int((np.nan_to_num(P, nan=-1.0) >= threshold).sum()),
               "median_P": float(np.nanmedian(P)) if np.isfinite(P).any() else float("nan")}
        if "P_scrambled_median" in hd:
            row["median_P_scrambled"] = float(np.nanmedian(hd["P_scrambled_median"].to_numpy(dtype=float)))
        rows.append(row)
    lead = ["checkpoint", "order", "step"]
    heads_df = pd.concat(head_tables, ignore_index=True)
    heads_df = heads_df[lead + [c for c in heads_df.columns if c not in lead]]
    layers_df = pd.concat(layer_tables, ignore_index=True)
    layers_df = layers_df[lead + [c for c in layers_df.columns if c not in lead]]
    return Trajectory(heads=heads_df, layers=layers_df, checkpoints=pd.DataFrame(rows), threshold=float(threshold),
                      options=options)
