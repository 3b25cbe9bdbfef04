"""The per-head idempotence report: one pass over the layers, every analysis per layer.

Data flow: a :class:`~tl_idempotence.heads.HeadSource` yields one
:class:`~tl_idempotence.heads.LayerHeads` at a time; each layer's Gram products are
computed once and shared by the closure, the controls and the algebra; the layer's
weights are then dropped, so memory is bounded by one layer.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import pickle
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from .heads import LayerHeads, ModelInfo, head_source
from .linalg import Closure, Grams, closure_from_grams, layer_grams

__all__ = ["IdempotenceReport", "closure_table", "idempotence_report"]

#: Columns of :attr:`IdempotenceReport.heads` always present (SPEC sections 2-3).
HEAD_COLUMNS = ["layer", "head", "kv_head", "alpha", "P", "norm", "norm_T2", "rank_O", "rank_V", "closed", "reason"]


def _version(pkg: str) -> str | None:
    try:
        return importlib.metadata.version(pkg)
    except importlib.metadata.PackageNotFoundError:
        return None


def closure_table(lh: LayerHeads, c: Closure, threshold: float) -> pd.DataFrame:
    """Per-head rows (``HEAD_COLUMNS``) for one layer's :class:`Closure`."""
    P = c.P.numpy()
    return pd.DataFrame(
        {
            "layer": lh.layer,
            "head": np.arange(lh.n_heads),
            "kv_head": lh.kv_head_of.numpy(),
            "alpha": c.alpha.numpy(),
            "P": P,
            "norm": c.norm.numpy(),
            "norm_T2": c.norm_T2.numpy(),
            "rank_O": c.rank_O.numpy(),
            "rank_V": c.rank_V.numpy()[...],
            "closed": np.nan_to_num(P, nan=-1.0) >= threshold,
            "reason": c.reason.astype(str),
        }
    )


@dataclass
class IdempotenceReport:
    """Result of :func:`idempotence_report`.

    Attributes:
        heads: one row per (layer, head): at least ``layer, head, kv_head, alpha, P,
            norm, norm_T2, rank_O, rank_V, closed, reason`` (SPEC 2-3); with
            ``nulls=True`` also the scramble columns (SPEC 4b).
        layers: one row per layer: counts and medians; with ``nulls=True`` the
            trained-vs-scrambled medians and the O/V mismatch (SPEC 4a); with
            ``search=True`` the feasible P (SPEC 5).
        summary: dict of headline numbers, model sizes, processing flags and versions.
        info: the :class:`~tl_idempotence.heads.ModelInfo` of what was measured.
        threshold: P threshold for ``closed`` (paper: 0.9).
        algebra: shared-value algebra results when asked (SPEC 7), else ``None``.
        model: the model the report was made from when it was a TransformerLens
            model (used by :meth:`show_attention`), else ``None``. Not serialized.
    """

    heads: pd.DataFrame
    layers: pd.DataFrame
    summary: dict[str, Any]
    info: ModelInfo
    threshold: float
    algebra: Any = None
    model: Any = field(default=None, repr=False)
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def closed_heads(self) -> pd.DataFrame:
        """Rows of :attr:`heads` with ``P >= threshold``, sorted by P descending."""
        return self.heads[self.heads["closed"]].sort_values("P", ascending=False)

    def paper_table(self) -> pd.DataFrame:
        """The abstract's headline quantities for this model next to the paper's figures.

        Columns ``quantity, this model, paper``; see :func:`tl_idempotence.nulls.paper_table`.

        Raises:
            ValueError: the report was made without ``nulls`` (the controls did not run).
        """
        from .nulls import paper_table

        return paper_table(self)

    def figure(self, value: str = "P"):
        """Plotly heatmap (layer x head) of ``value`` (default P); hover shows alpha, norm, kv head."""
        from .viz import heads_heatmap

        return heads_heatmap(self, value=value)

    def save_html(
        self,
        path: str,
        attention_text: str | None = None,
        attention_heads: list[tuple[int, int]] | None = None,
        top_k: int = 8,
        **kwargs: Any,
    ) -> str:
        """Write a standalone HTML report (plotly.js embedded, no CDN) and return the path.

        Args:
            path: output file.
            attention_text: when given, add a circuitsvis view of the flagged heads'
                attention patterns on this text (JS bundle inlined, renders offline;
                needs a report made from a TransformerLens model).
            attention_heads: ``(layer, head)`` pairs to show (default: the closed heads,
                or the ``top_k`` heads by P; see :func:`tl_idempotence.attention.flagged_heads`).
            top_k: how many heads by default.
            **kwargs: passed to :func:`tl_idempotence.viz.report_html` (``extra_figures``, ``extra_html``).
        """
        from .viz import report_html

        if attention_text is not None:
            from .attention import attention_section_html

            extra = list(kwargs.pop("extra_html", None) or [])
            extra.append(attention_section_html(self, attention_text, heads=attention_heads, top_k=top_k))
            kwargs["extra_html"] = extra
        html = report_html(self, **kwargs)
        with open(path, "w", encoding="utf-8") as f:
            f.write(html)
        return str(path)

    def show_attention(self, text: str, heads: list[tuple[int, int]] | None = None, top_k: int = 8, max_tokens: int = 48):
        """circuitsvis view of attention patterns of flagged heads on ``text`` (for notebooks, offline).

        Args:
            text: the text to run through :attr:`model`.
            heads: ``(layer, head)`` pairs (default: closed heads, else the ``top_k`` by P).
            top_k: how many heads by default.
            max_tokens: truncate the text to this many tokens.

        Returns:
            :class:`tl_idempotence.attention.AttentionView` (displays itself in Jupyter).

        Raises:
            ValueError: the report has no TransformerLens model attached.
        """
        from .attention import attention_view, flagged_heads

        if self.model is None:
            raise ValueError(
                "This report has no TransformerLens model attached (made from a checkpoint file or a transformers "
                "model): call tl_idempotence.attention.attention_view(model, text, heads) with a TL model."
            )
        heads = list(heads) if heads is not None else flagged_heads(self, top_k=top_k)
        return attention_view(self.model, text, heads, max_tokens=max_tokens, head_table=self.heads)

    def _repr_html_(self) -> str:  # notebooks
        s = self.summary
        return (
            f"<b>IdempotenceReport</b> of {s['model_name']}: {s['n_closed']}/{s['n_heads']} heads with "
            f"P &ge; {self.threshold} ({100 * s['frac_closed']:.2f}%), median P {s['median_P']:.4g}"
        )


def _summary(heads: pd.DataFrame, info: ModelInfo, threshold: float, options: dict[str, Any]) -> dict[str, Any]:
    P = heads["P"].to_numpy(dtype=float)
    n = len(heads)
    n_closed = int(heads["closed"].sum())
    per_layer = heads.groupby("layer")["closed"].sum().astype(int).to_dict()
    return {
        "model_name": info.model_name,
        "model_class": info.model_class,
        "n_layers": info.n_layers,
        "n_attention_layers": int(heads["layer"].nunique()),
        "n_heads": n,
        "n_heads_per_layer": info.n_heads,
        "n_kv_heads": info.n_kv_heads,
        "d_model": info.d_model,
        "d_head": info.d_head,
        "threshold": threshold,
        "n_closed": n_closed,
        "frac_closed": n_closed / n if n else float("nan"),
        "median_P": float(np.nanmedian(P)) if np.isfinite(P).any() else float("nan"),
        "n_undefined_P": int(np.isnan(P).sum()),
        "closed_per_layer": {int(k): int(v) for k, v in per_layer.items()},
        "processing": info.processing,
        "options": options,
        "versions": {
            "tl_idempotence": _version("tl_idempotence"),
            "transformer_lens": _version("transformer-lens"),
            "torch": torch.__version__,
        },
        **({"source": info.extra} if info.extra else {}),
    }


def idempotence_report(
    model: Any,
    threshold: float = 0.9,
    *,
    nulls: bool | int = False,
    seed: int = 0,
    search: bool = False,
    algebra: bool = False,
    layers: list[int] | None = None,
    compute_dtype: torch.dtype = torch.float64,
    progress: bool = True,
    resume: str | os.PathLike | None = None,
    **source_kwargs: Any,
) -> IdempotenceReport:
    """Closure of every attention head of a model, with the paper's controls on request.

    Args:
        model: a TransformerLens model (HookedTransformer, HookedEncoder,
            TransformerBridge), a ``transformers`` model, a path to a checkpoint
            directory or ``.gguf`` file, or a :class:`~tl_idempotence.heads.HeadSource`.
        threshold: P threshold for a "closed" head (paper: 0.9), in [0, 1].
        nulls: ``True`` (64 draws) or an int number of orientation-scramble draws per
            head; also runs the matched O/V mismatch (SPEC 4).
        seed: seed of the scramble draws and the search restarts (per layer, the
            generator is seeded with ``(seed, layer)`` so results do not depend on
            which layers were run).
        search: run the constructive search per layer (SPEC 5; slow).
        algebra: run the shared-value algebra per kv group (SPEC 7).
        layers: restrict to these layer indices (default: all attention layers).
        compute_dtype: dtype of the ``d_model``-long products (float64 default).
        progress: show a tqdm bar per layer on stderr.
        resume: a directory for per-layer part files. Each finished layer is written
            there atomically (temp file + ``os.replace``) with a ``manifest.json`` of the
            options and the source fingerprint; a later call with the same directory
            skips the finished layers (an interrupted run resumes) and refuses
            (``ValueError``) when the options or the checkpoint differ.
        **source_kwargs: passed to the checkpoint source (``architecture``, ``prefix``, ...).

    Returns:
        :class:`IdempotenceReport`.

    Raises:
        TypeError: unsupported model object.
        ValueError: bad threshold, a model without attention, NaN/inf weights (the
            message names layer and head), an unknown layer index.
    """
    if not (0.0 <= float(threshold) <= 1.0):
        raise ValueError(f"threshold must be in [0, 1] (P is a squared cosine); got {threshold}.")
    n_draws = 64 if nulls is True else int(nulls or 0)
    if n_draws < 0:
        raise ValueError(f"nulls must be True/False or a non-negative number of draws; got {nulls}.")
    src = head_source(model, **source_kwargs)
    all_layers = list(src.layers())
    if layers is None:
        todo = all_layers
    else:
        bad = [l for l in layers if l not in all_layers]
        if bad:
            raise ValueError(f"Unknown layer index {bad}: this model's attention layers are {all_layers[0]}..{all_layers[-1]}.")
        todo = list(layers)
    options = {"nulls": n_draws, "seed": seed, "search": search, "algebra": algebra, "compute_dtype": str(compute_dtype)}
    parts = _ResumeDir(resume, {"threshold": float(threshold), **options}, src) if resume is not None else None

    head_rows: list[pd.DataFrame] = []
    layer_rows: list[dict[str, Any]] = []
    algebra_parts: list[Any] = []
    bar = tqdm(todo, desc="layers", unit="layer", disable=not progress)
    for layer in bar:
        done = parts.load(layer) if parts is not None else None
        if done is not None:
            df, lrow, apart = done
        else:
            lh = src.layer_heads(layer)
            g = layer_grams(lh.O, lh.V, lh.kv_head_of, compute_dtype=compute_dtype)
            c = closure_from_grams(g)
            df, lrow = _analyse_layer(lh, g, c, threshold, n_draws, seed, search, compute_dtype)
            apart = None
            if algebra:
                from .algebra import layer_algebra

                apart = layer_algebra(lh, g, threshold=threshold)
            del lh, g, c
            if parts is not None:
                parts.save(layer, (df, lrow, apart))
        head_rows.append(df)
        layer_rows.append(lrow)
        if algebra:
            algebra_parts.append(apart)
    heads_df = pd.concat(head_rows, ignore_index=True)
    layers_df = pd.DataFrame(layer_rows)
    summary = _summary(heads_df, src.info, threshold, options)
    algebra_res = None
    if algebra:
        from .algebra import combine_layers

        algebra_res = combine_layers(algebra_parts, src.info)
        summary["algebra"] = algebra_res.summary()
    rep = IdempotenceReport(
        heads=heads_df,
        layers=layers_df,
        summary=summary,
        info=src.info,
        threshold=threshold,
        algebra=algebra_res,
        model=getattr(src, "model", None),
        options=options,
    )
    if n_draws or search:
        from .nulls import summarize_controls

        summarize_controls(rep)
    return rep


def _analyse_layer(
    lh: LayerHeads,
    g: Grams,
    c: Closure,
    threshold: float,
    n_draws: int,
    seed: int,
    search: bool,
    compute_dtype: torch.dtype,
) -> tuple[pd.DataFrame, dict[str, Any]]:
    """All per-layer analyses on one layer's shared Gram products."""
    df = closure_table(lh, c, threshold)
    P = c.P.numpy()
    lrow: dict[str, Any] = {
        "layer": lh.layer,
        "n_heads": lh.n_heads,
        "n_kv_heads": lh.n_kv_heads,
        "n_closed": int(df["closed"].sum()),
        "median_P": float(np.nanmedian(P)) if np.isfinite(P).any() else float("nan"),
        "max_P": float(np.nanmax(P)) if np.isfinite(P).any() else float("nan"),
    }
    if n_draws:
        from .nulls import mismatch_layer, scramble_layer

        sc = scramble_layer(lh, g, c, n_draws=n_draws, seed=seed, threshold=threshold)
        df = pd.concat([df, sc.reset_index(drop=True)], axis=1)
        lrow.update(mismatch_layer(lh, threshold=threshold, compute_dtype=compute_dtype, g=g))
        lrow["median_P_scrambled"] = float(np.nanmedian(sc["P_scrambled_median"].to_numpy(dtype=float)))
        lrow["frac_beats_scramble"] = float(sc["beats_scramble"].mean())
        lrow["trained_wins"] = bool(lrow["median_P"] > lrow["median_P_scrambled"])
    if search:
        from .search import search_layer

        sh, sl = search_layer(lh, g, c, seed=seed, threshold=threshold)
        df = pd.concat([df, sh.reset_index(drop=True)], axis=1)
        lrow.update(sl)
    return df, lrow


class _ResumeDir:
    """Per-layer part files of an interruptible report (``idempotence_report(..., resume=dir)``).

    Layout: ``manifest.json`` (format, options, source fingerprint) and one
    ``layer_{l:05d}.pkl`` per finished layer holding ``(heads rows, layer row,
    algebra part)``. Every file is written to a temp name in the same directory and
    moved into place with ``os.replace``, so a file with a final name is always
    complete; stray ``*.tmp*`` files from a killed run are ignored. The parts are
    pickles written by this library for this library: only resume from directories
    you created.

    Raises:
        ValueError: the directory holds a manifest for other options or another checkpoint.
    """

    FORMAT = "tl_idempotence.resume/1"

    def __init__(self, path: str | os.PathLike, options: dict[str, Any], src: Any) -> None:
        self.dir = Path(path)
        self.dir.mkdir(parents=True, exist_ok=True)
        fp = src.fingerprint() if callable(getattr(src, "fingerprint", None)) else {
            k: getattr(src.info, k) for k in ("model_name", "model_class", "n_layers", "n_heads", "n_kv_heads",
                                              "d_model", "d_head", "processing")
        }
        manifest = json.loads(json.dumps({"format": self.FORMAT, "options": options, "source": fp},
                                         sort_keys=True, default=str))
        mfile = self.dir / "manifest.json"
        if mfile.exists():
            old = json.loads(mfile.read_text(encoding="utf-8"))
            if old != manifest:
                diff = [f"{sec}.{k}: {old.get(sec, {}).get(k)!r} -> {manifest[sec].get(k)!r}"
                        for sec in ("options", "source") for k in sorted(set(old.get(sec, {})) | set(manifest[sec]))
                        if old.get(sec, {}).get(k) != manifest[sec].get(k)]
                if old.get("format") != manifest["format"]:
                    diff.insert(0, f"format: {old.get('format')!r} -> {manifest['format']!r}")
                raise ValueError(
                    f"Cannot resume in {self.dir}: its parts were made with different options or from another "
                    f"checkpoint ({'; '.join(diff[:6])}). Use a new directory, or delete this one to start over."
                )
        else:
            self._write(mfile, json.dumps(manifest, indent=2, sort_keys=True).encode())

    def _part(self, layer: int) -> Path:
        return self.dir / f"layer_{int(layer):05d}.pkl"

    def _write(self, path: Path, data: bytes) -> None:
        tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    def load(self, layer: int) -> tuple[pd.DataFrame, dict[str, Any], Any] | None:
        p = self._part(layer)
        if not p.exists():
            return None
        with open(p, "rb") as f:
            return pickle.load(f)

    def save(self, layer: int, part: tuple[pd.DataFrame, dict[str, Any], Any]) -> None:
        self._write(self._part(layer), pickle.dumps(part, protocol=pickle.HIGHEST_PROTOCOL))
