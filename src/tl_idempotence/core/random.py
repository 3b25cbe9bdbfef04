"""Seeded randomness: per-layer generators and Haar-distributed orthogonal matrices (SPEC 4b, 5).

* :func:`layer_generator` — a CPU ``torch.Generator`` seeded from ``(seed, layer, tag, ...)``
  through ``numpy.random.SeedSequence``, so a layer's draws never depend on which other
  layers ran, and are the same on any machine with the same torch version.
* :func:`head_generator` — the same, for one head: ``(seed, layer, head, tag, ...)``, so a
  head's draws never depend on which other heads (or layers) ran, nor in what order.
* :func:`haar_orthogonal` — QR of Gaussian matrices with the sign fix (Mezzadri 2007).
* :func:`sign_fixed_qr` — the orthonormalization both the sampler and the search use.
* :func:`embed_orthogonal` — ``blockdiag(Q, I)`` for rank-deficient heads.

Imports torch and numpy only.
"""

from __future__ import annotations

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor

from ..errors import OptionError
from .options import check_int, check_seed

__all__ = ["TAGS", "embed_orthogonal", "haar_orthogonal", "head_generator", "layer_generator", "sign_fixed_qr"]

#: Stream tags: two analyses never share a stream.
TAGS = {
    "scramble": 1,
    "search": 2,
    "ablation": 3,
    "roles": 4,
    "circuit": 5,
    "association": 6,
    "head_tokens": 7,
    "token_effect": 8,
}


def layer_generator(seed: int, layer: int | None, tag: str = "scramble", *extra: int) -> torch.Generator:
    """A CPU ``torch.Generator`` seeded from ``(seed, layer, tag, *extra)``.

    The 64-bit seed comes from ``numpy.random.SeedSequence`` (a documented,
    platform-independent hash); Python's ``hash`` is not used.

    Args:
        seed: the user's seed (non-negative int).
        layer: layer index, or ``None`` outside a model (treated as -1).
        tag: which analysis (a key of :data:`TAGS`), so they never share a stream.
        extra: more non-negative ints to mix in (e.g. a rank pair).

    Raises:
        OptionTypeError / OptionError: a seed that is not a non-negative int; an unknown tag.
    """
    seed = check_seed(seed)
    if tag not in TAGS:
        raise OptionError(f"Unknown random stream tag {tag!r}; known: {sorted(TAGS)}.")
    entropy = [seed, 0 if layer is None else int(layer) + 1, TAGS[tag], *[int(e) for e in extra]]
    state = np.random.SeedSequence(entropy).generate_state(2, dtype=np.uint32)
    s = (int(state[0]) << 31) ^ int(state[1])
    return torch.Generator(device="cpu").manual_seed(s & ((1 << 63) - 1))


#: Marks a per-head stream in the entropy (so ``head_generator(s, l, h, t)`` never equals a
#: ``layer_generator(s, l, t, *extra)`` of a layer-level stream with the same numbers).
HEAD_STREAM = 1 << 30


def head_generator(seed: int, layer: int | None, head: int, tag: str, *extra: int) -> torch.Generator:
    """A CPU ``torch.Generator`` for one head: seeded from ``(seed, layer, tag, HEAD_STREAM, head, *extra)``.

    A head's draws then depend only on ``(seed, layer, head)`` (and the tag/extra stream
    labels), never on which other heads or layers ran, nor in what order (SPEC 4b, 5).

    Args:
        seed: the user's seed (non-negative int).
        layer: layer index, or ``None`` outside a model.
        head: the head's index within its layer (or within the flattened batch outside a model), >= 0.
        tag: which analysis (a key of :data:`TAGS`).
        extra: more non-negative ints (e.g. a sub-stream number).

    Raises:
        OptionTypeError / OptionError: a bad seed or head (negative, bool, not an int); an unknown tag.
    """
    head = check_int(head, "head", 0)
    return layer_generator(seed, layer, tag, HEAD_STREAM, head, *extra)


def sign_fixed_qr(X: Float[Tensor, "*b r r"]) -> Float[Tensor, "*b r r"]:
    """The Q factor of ``X = QR`` with ``diag(R) >= 0`` (``Q ← Q diag(sign(diag R))``).

    Unique for invertible ``X``; an orthogonal ``X`` is returned unchanged (to rounding).
    """
    Q, R = torch.linalg.qr(X)
    d = R.diagonal(dim1=-2, dim2=-1)
    sign = torch.where(d < 0, -torch.ones_like(d), torch.ones_like(d))
    return Q * sign.unsqueeze(-2)


def haar_orthogonal(n: int, r: int, gen: torch.Generator, dtype: torch.dtype = torch.float64) -> Float[Tensor, "n r r"]:
    """``n`` independent Haar-distributed matrices in ``O(r)`` (Haar measure on the orthogonal group).

    QR of a standard Gaussian ``r x r`` matrix with the sign fix (Mezzadri 2007, "How to
    generate random matrices from the classical compact groups"), batched. float32 and
    float64 sample in that dtype; float16/bfloat16 (which QR does not support) sample in
    float32 and are rounded to ``dtype``.

    Args:
        n: number of matrices (>= 0).
        r: size (>= 1).
        gen: CPU generator (see :func:`layer_generator`).
        dtype: a real floating dtype.

    Returns:
        ``[n, r, r]`` orthogonal matrices in ``dtype``.

    Raises:
        OptionTypeError / OptionError: ``n < 0``, ``r < 1``, a non-float dtype.
    """
    n = check_int(n, "n", 0)
    r = check_int(r, "r", 1)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise OptionError(f"haar_orthogonal: dtype must be a real floating dtype; got {dtype!r}.")
    work = dtype if dtype in (torch.float32, torch.float64) else torch.float32
    Z = torch.randn(n, r, r, generator=gen, dtype=work)
    return sign_fixed_qr(Z).to(dtype)


def embed_orthogonal(Q: Float[Tensor, "n k k"], r: int) -> Float[Tensor, "n r r"]:
    """Embed ``[n, k, k]`` orthogonal matrices as ``blockdiag(Q, I_{r-k})``."""
    n, k, _ = Q.shape
    if k == r:
        return Q
    out = torch.eye(r, dtype=Q.dtype).expand(n, r, r).clone()
    out[:, :k, :k] = Q
    return out
