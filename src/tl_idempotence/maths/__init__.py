"""Layer 3 — the closure maths on per-layer head factors (SPEC sections 1-3): :mod:`.closure` (Gram products, α,
P, ``Closure``, ``closure()``).

Imports torch, numpy and jaxtyping, ``core`` and the ``views`` (a ``Closure`` draws its notebook display through
:class:`~tl_idempotence.views.results.DrawnResult`), nothing of the layers above.
"""
