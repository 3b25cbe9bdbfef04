"""The exact self-rank counts of the token readout (SPEC 12; :func:`~tl_idempotence.probes.head_tokens.head_tokens`).

Per layer and per tile of vocabulary columns: one float64 product ``W_U[:, tile]ᵀ @ W_O[heads]ᵀ`` gives the
``W_OU = W_O[h] @ W_U`` columns of every selected head of the layer (``[tile, heads · d_head]``; float64 because
``W_O W_U`` cancels heavily: a float32 product's rounding bound, in ``|W_O| |W_U|``, left ~200 close calls per row on
SmolLM2, this one ~2); per head and chunk of source tokens the float32 logits ``fl32(x) @ fl32(W_OU)``
(``x = W_E[tokens] @ W_V``, inner dimension ``d_head``) are compared with ``logit_t ± b`` (one ``>``, one ``<`` and
their counts per block). The ranks are those of the float64 rows ``ℓ_u = fl64(fl64(x @ W_O) · W_U[:, u])`` (the row
form's association): ``b`` is a rigorous bound on ``|logit32_u - ℓ_u|`` over the tile (``γ_n = n u / (1 - n u)``
of the standard dot-product analysis, Cauchy-Schwarz over the inner dimension), and the logits within ``b`` of
``logit_t`` (the source token itself among them) are recomputed as ``ℓ_u`` and compared exactly, so a rank never
depends on float32 rounding.

:func:`svd_directions` gives the leading singular triplets of ``W_V W_O`` from its ``d_head``-sized factors.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = [
    "HEAD_BLOCK_ELEMS",
    "RECOUNT_ELEMS",
    "SCORE_ROWS",
    "U64_CACHE_BYTES",
    "direction_extremes",
    "float64_tiles",
    "gamma32",
    "gamma64",
    "layer_counts",
    "row_norms",
    "svd_directions",
]

#: Largest float64 copy of W_U kept for one call (larger unembeddings are converted tile by tile).
U64_CACHE_BYTES = 1 << 29
#: float32 logits per block at most when the heads of a layer are taken together (``heads x chunk x tile``).
HEAD_BLOCK_ELEMS = 1 << 21
#: float64 elements gathered at a time by the recount of close calls.
RECOUNT_ELEMS = 1 << 22

_U32 = 2.0**-24  # float32 unit roundoff
_U64 = 2.0**-53  # float64 unit roundoff


def gamma32(n: int) -> float:
    """``γ_n`` of float32 (``n u / (1 - n u)``, ``u = 2^-24``)."""
    return n * _U32 / (1 - n * _U32)


def gamma64(n: int) -> float:
    """``γ_n`` of float64 (``u = 2^-53``)."""
    return n * _U64 / (1 - n * _U64)


def row_norms(rows: torch.Tensor) -> torch.Tensor:
    """float64 Euclidean norms of ``rows`` (``[m, d]``), 8192 rows at a time (no float64 copy of the whole)."""
    return torch.cat([rows[s : s + 8192].double().norm(dim=1) for s in range(0, rows.shape[0], 8192)])


def _up32(v: torch.Tensor) -> torch.Tensor:
    """float32 values ``>= v`` (float64), the nearest such (inf when beyond float32's range)."""
    f = v.to(torch.float32)
    low = f.double() < v
    return torch.where(low, torch.nextafter(f, torch.full_like(f, float("inf"))), f)


def _down32(v: torch.Tensor) -> torch.Tensor:
    """float32 values ``<= v`` (float64), the nearest such (-inf when beyond float32's range)."""
    f = v.to(torch.float32)
    high = f.double() > v
    return torch.where(high, torch.nextafter(f, torch.full_like(f, float("-inf"))), f)


def layer_counts(
    xs: list[torch.Tensor],
    O64: torch.Tensor,
    U_rows: torch.Tensor,
    u_norm: torch.Tensor,
    tok: torch.Tensor,
    chunk: int,
    tile: int,
    U_tiles: Any,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(above, below, L, y_norm, z_norm)`` ``[heads, n]`` of the selected heads of one layer (module docstring):
    the int64 counts, the float64 self logits ``ℓ_t``, ``‖y‖`` and ``‖|x| |W_O|‖`` (with ``y = fl64(x @ W_O)``).

    ``xs``: per head ``[n, d_head]`` float64 ``W_E[tokens] @ W_V[kv]``; ``O64``: ``[heads, d_head, d_model]``
    float64 ``W_O``; ``U_rows``: ``[d_vocab, d_model]`` (``W_U`` transposed; float32 or float64);
    ``u_norm``: ``[d_vocab]`` float64 norms of its rows; ``tok``: ``[n]`` ids; ``U_tiles(a, T)``: its rows
    ``a .. a+T`` in float64 (:func:`float64_tiles`).

    Per tile of ``tile`` vocabulary columns, one float64 product ``W_U[:, tile]ᵀ @ W_O[heads]ᵀ`` gives every
    head's ``W_OU`` columns (``[tile, heads * d_head]``); each head's float32 logits ``fl32(x) @ fl32(W_OU)``
    (inner dimension ``d_head``) are compared with per-row thresholds ``logit_t ± b``. With
    ``y = fl64(x @ W_O)`` and the reference logits ``ℓ_u = fl64(y · W_U[:, u])`` (the row form's association;
    ``logit_t = ℓ_t``), the standard dot-product bounds give, for every ``u`` of the tile,

        |logit32_u - ℓ_u| <= g1 ‖x‖ max_tile ‖W_OU[:, u]‖ + g2 ‖|x| |W_O|‖ max_tile ‖W_U[:, u]‖ = b

    (Cauchy-Schwarz over the inner dimensions; ``g1 = γ_{d_head}(1+u)² + 2u + u²`` for the float32 product and
    the two float32 casts, ``g2 = γ64_{d_head} + 3 γ64_{d_model}`` for the float64 products on both sides).
    A logit above ``fl32↑(logit_t + b)`` or below ``fl32↓(logit_t - b)`` is surely above / below; the rest
    (the source token itself always among them) are recomputed as ``ℓ_u`` and compared exactly.
    """
    H, d_head, d_model = O64.shape
    n = len(tok)
    d_vocab = U_rows.shape[0]
    dev = O64.device
    OT = O64.reshape(H * d_head, d_model).T  # [d_model, H * d_head]
    X = torch.stack(xs)  # [H, n, d_head] float64
    Y = torch.bmm(X, O64)  # [H, n, d_model] float64: y = fl64(x @ W_O), per head
    L = (Y * U_rows[tok].double()).sum(-1)  # [H, n] float64: ℓ_t
    X32 = X.to(torch.float32)
    g1 = gamma32(d_head) * (1 + _U32) ** 2 + 2 * _U32 + _U32**2
    g2 = gamma64(d_head) + 3 * gamma64(d_model)
    slack = 1 + 1e-9  # the norms' and the bound's own float64 rounding (relative <= 1e-13)
    xn = X.norm(dim=2)  # [H, n]
    zn = torch.bmm(X.abs(), O64.abs()).norm(dim=2)  # [H, n]
    above = torch.zeros(H, n, dtype=torch.long, device=dev)
    below = torch.zeros(H, n, dtype=torch.long, device=dev)
    c_rows = min(chunk, n)
    width = min(tile, d_vocab)
    hb = max(1, min(H, HEAD_BLOCK_ELEMS // (c_rows * width)))  # heads per block: fewer, larger operations
    buf = torch.empty(hb, c_rows, width, dtype=torch.float32, device=dev)
    m_up = torch.empty(hb, c_rows, width, dtype=torch.bool, device=dev)
    m_dn = torch.empty_like(m_up)
    for a in range(0, d_vocab, tile):
        T = min(tile, d_vocab - a)
        W64 = U_tiles(a, T) @ OT  # [T, H * d_head]: W_OU's columns of this tile, every head
        W32 = W64.to(torch.float32).view(T, H, d_head).permute(1, 2, 0).contiguous()  # [H, d_head, T]
        c_max = W64.view(T, H, d_head).norm(dim=2).amax(0)  # [H]
        u_max = float(u_norm[a : a + T].max())
        in_tile = ((tok >= a) & (tok < a + T)).to(torch.int32)
        B = (g1 * xn * c_max[:, None] + g2 * zn * u_max) * slack  # [H, n]
        B = B + (L.abs() + B) * 2.0**-51  # L ± b's own float64 rounding
        hi, lo = _up32(L + B), _down32(L - B)  # [H, n] float32
        for h0 in range(0, H, hb):
            hs = min(hb, H - h0)
            for c in range(0, n, chunk):
                cs = min(chunk, n - c)
                lg = torch.bmm(X32[h0 : h0 + hs, c : c + cs], W32[h0 : h0 + hs], out=buf[:hs, :cs, :T])
                up = torch.gt(lg, hi[h0 : h0 + hs, c : c + cs, None], out=m_up[:hs, :cs, :T])
                dn = torch.lt(lg, lo[h0 : h0 + hs, c : c + cs, None], out=m_dn[:hs, :cs, :T])
                n_up = up.view(torch.uint8).sum(2, dtype=torch.int32)  # [hs, cs]
                n_dn = dn.view(torch.uint8).sum(2, dtype=torch.int32)
                above[h0 : h0 + hs, c : c + cs] += n_up
                below[h0 : h0 + hs, c : c + cs] += n_dn
                # rows with close calls besides their source token (always close: |logit32_t - ℓ_t| <= b)
                hh, rows = (n_up + n_dn + in_tile[None, c : c + cs] < T).nonzero(as_tuple=True)
                if len(rows):
                    k, u = (~(up[hh, rows] | dn[hh, rows])).nonzero(as_tuple=True)
                    j, r, u = hh[k] + h0, rows[k] + c, u + a
                    keep = u != tok[r]
                    _recount(Y, L, U_rows, j[keep], r[keep], u[keep], above, below)
    return above, below, L, Y.norm(dim=2), zn


def float64_tiles(U_rows: torch.Tensor) -> Any:
    """``f(a, T)``: rows ``a .. a+T`` of ``U_rows`` in float64 (from one float64 copy when it takes at most
    ``U64_CACHE_BYTES``, else converted per call)."""
    if U_rows.dtype == torch.float64:
        return lambda a, T: U_rows[a : a + T]
    if U_rows.numel() * 8 <= U64_CACHE_BYTES:
        U64 = U_rows.double()
        return lambda a, T: U64[a : a + T]
    return lambda a, T: U_rows[a : a + T].double()


def _recount(
    Y: torch.Tensor,
    L: torch.Tensor,
    U_rows: torch.Tensor,
    j: torch.Tensor,
    r: torch.Tensor,
    u: torch.Tensor,
    above: torch.Tensor,
    below: torch.Tensor,
) -> None:
    """Adds to ``above[j, r]`` / ``below[j, r]`` whether ``ℓ_u = fl64(Y[j, r] · W_U[:, u]) > / < L[j, r]`` (in
    place; ``Y`` ``[heads, n, d_model]``)."""
    step = max(1, RECOUNT_ELEMS // Y.shape[2])
    n = Y.shape[1]
    for s in range(0, len(r), step):
        jj, rr, uu = j[s : s + step], r[s : s + step], u[s : s + step]
        exact = (Y[jj, rr] * U_rows[uu].double()).sum(-1)
        Lr = L[jj, rr]
        flat = jj * n + rr
        above.view(-1).index_add_(0, flat, (exact > Lr).long())
        below.view(-1).index_add_(0, flat, (exact < Lr).long())


def svd_directions(V: torch.Tensor, W_O: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Leading ``n`` singular triplets of ``V @ W_O`` (``[d_model, d_head] @ [d_head, d_model]``, float64) from the
    factors: ``(read [d_model, n], sigma [n], write [d_model, n])`` with ``V W_O = Σ σ_i read_i write_iᵀ``."""
    Qv, Rv = torch.linalg.qr(V)
    Qo, Ro = torch.linalg.qr(W_O.T)
    A, S, Bt = torch.linalg.svd(Rv @ Ro.T)
    return Qv @ A[:, :n], S[:n], Qo @ Bt.T[:, :n]


#: Vocabulary rows per block of the singular directions' token scores.
SCORE_ROWS = 8192


def direction_extremes(
    W_E: torch.Tensor, W_U32: torch.Tensor, reads: torch.Tensor, writes: torch.Tensor, k: int, dev: torch.device
) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """The ``k`` largest and smallest token scores of each direction, in one pass over the vocabulary for all.

    ``reads``/``writes``: ``[d_model, m]`` (float64) columns; the scores ``W_E @ reads[:, j]`` and
    ``writes[:, j] @ W_U`` are float32 products over blocks of :data:`SCORE_ROWS` tokens, each block's top and
    bottom ``k`` merged into the running ones (never the ``[d_vocab, m]`` scores at once).

    Returns:
        ``{"read_top", "read_bottom", "write_top", "write_bottom"}``: each ``(values [k, m] float32, ids [k, m])``,
        the top largest first and the bottom smallest first.
    """
    R = reads.to(dev, torch.float32)
    Wt = writes.to(dev, torch.float32).T.contiguous()  # [m, d_model]
    out: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    def merge(key: str, vals: torch.Tensor, ids: torch.Tensor, largest: bool) -> None:
        if key in out:
            vals = torch.cat([out[key][0], vals])
            ids = torch.cat([out[key][1], ids])
        v, i = torch.topk(vals, min(k, len(vals)), dim=0, largest=largest, sorted=True)
        out[key] = (v, torch.gather(ids, 0, i))

    d_vocab = int(W_E.shape[0])
    for s in range(0, d_vocab, SCORE_ROWS):
        e = min(d_vocab, s + SCORE_ROWS)
        ids = torch.arange(s, e, device=dev).unsqueeze(1)
        rs = W_E[s:e].to(dev, torch.float32) @ R  # [block, m]
        ws = (Wt @ W_U32[:, s:e]).T  # [block, m]
        for side, sc in (("read", rs), ("write", ws)):
            full = ids.expand(-1, sc.shape[1])
            merge(f"{side}_top", sc, full, True)
            merge(f"{side}_bottom", sc, full, False)
    return out
