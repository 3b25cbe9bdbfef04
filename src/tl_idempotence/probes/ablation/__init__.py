"""Do the flagged heads matter? Next-token loss with them ablated, against matched random head sets.

A near-idempotent head is interesting if the model needs it. :func:`ablation` runs a causal
TransformerLens model (``HookedTransformer`` or ``TransformerBridge``) on real text and
measures the next-token loss

* clean;
* with the given heads ablated together (the *flagged set*);
* with ``n_controls`` random head sets *matched* to the flagged set (below);
* with ``singles=True``, with each given head ablated alone;

and returns the loss change ``Δ = loss_ablated − loss_clean`` (nats per target token) of each,
the control distribution, an exact p-value over head sets, and an effect size with a 95 %
bootstrap interval. It is not a per-layer weight analysis: nothing is registered in the report loop.

**Ablation** is done at ``blocks.{l}.attn.hook_z`` ``[batch, pos, n_heads, d_head]`` — the
head's value-weighted mix before ``W_O`` (on a ``HookedTransformer`` the hook itself; on a
``TransformerBridge`` the alias of ``attn.o.hook_in``, reshaped by the bridge to the same
layout and reshaped back after the hook), so a head's contribution ``z_h @ W_O[h]`` to the
residual stream is replaced while every other head, ``b_O`` and the rest of the model are
untouched. ``kind="zero"`` sets ``z_h = 0`` (the head writes nothing; ``b_O``, which belongs
to no head, stays). ``kind="mean"`` sets ``z_h`` to its mean over the clean run: the mean of
``z[b, p, h, :]`` over every *counted* position ``(b, p)`` of all evaluated windows (the
same mask as the loss: special-token positions such as BOS, an attention sink whose head
outputs are atypical, are left out of the mean), computed once per head in the clean pass —
so it does not depend on ``batch_size``. The replacement is applied at every position.
Zero-ablating every head of a layer therefore leaves exactly ``b_O`` as the layer's
attention output (0 for bias-free models such as Llama: the attention output is removed).

**Loss**: mean cross-entropy (nats) of the token at position ``p + 1`` given positions
``0..p``, over the target positions whose token is not a special token (BOS/EOS/PAD/...),
accumulated in float64 per window (:func:`~tl_idempotence.probes.tokens.prepare_tokens`:
the default corpus of standard-library docstrings when ``texts`` is None). A set's loss is
the sum over windows divided by the number of counted targets; ``window_losses`` keeps each
window's mean so every number can be recomputed.

**Batched head sets** (what makes many controls cheap): after the clean pass, each window is
run once per *chunk* of up to ``batch_size`` head sets. The window enters the model with
batch 1; at ``blocks.{k}.hook_resid_pre`` — ``k`` the first layer any set ablates (for matched
controls, the flagged set's first layer) — its residual stream is repeated once per set, and
each set's ``hook_z`` replacement is applied to its own copy. Layers before ``k`` are therefore
computed once per chunk instead of once per set, and the sets share each matrix product. The
numbers are those of one forward pass per set to float rounding (a test compares both on tiny
models). Every window's first chunk also holds an empty set (nothing ablated), whose loss is
compared with the clean pass's (the largest
difference, nats per token, is ``check_max_abs_diff`` in the summary). When a model refuses the
repeated residual (raises in a window's first shared-prefix pass), or a window's empty set differs by more
than :data:`CHECK_TOLERANCE` (1e-3 nats per token; 5e-2 for float16/bfloat16 models), that window and every
later one are run with the window repeated at the input instead (no shared prefix; ``summary["batching"]``
says which). A difference above the tolerance that remains is reported in the summary's ``note``. An error
raised while hooks of the user's are registered on the model (TransformerLens forward hooks present when
:func:`ablation` starts: ``model.add_hook``, a ``hooks()`` context) is never taken for a refusal: it
propagates in every pass, with a note saying so.

**Threads** (CPU): the first window's first two chunks run on one thread and on torch's thread
count; the faster (seconds per head set; torch's count on a tie) runs the rest, and torch's count
is restored at the end
(``summary["threads"]``, ``summary["threads_seconds_per_set"]``). On a machine whose cores other
processes keep busy, torch's intra-op threads mostly wait for each other: on this project's 2-core
machine a SmolLM2 forward pass took 2.5-3.3x longer on 2 threads than on 1 (``benchmarks/RESULTS.md``).
Nothing is changed when the user chose the count (``OMP_NUM_THREADS``, ``MKL_NUM_THREADS``, or
``torch.set_num_threads`` after this module was imported), on a GPU, or when there are fewer than
two full chunks (a small run).
Thread counts change float32 rounding only.

**Matched controls**: for each layer ``l`` holding ``k_l`` flagged heads, a control holds ``k_l``
distinct heads of the layer's *non-flagged* heads when it has at least ``k_l`` of them, otherwise of all
of the layer's heads (the control may then contain flagged heads; ``n_flagged_in_set`` counts them and the
summary says so). So a control set has the flagged set's size and per-layer composition. The controls are
pairwise **distinct** head sets and **never the flagged set**: ``n_distinct_controls``
(:func:`count_matched_sets`) is ``Π_l C(|pool_l|, k_l)``, less one when every layer draws from all its
heads (the flagged set is then one of the products). When ``n_distinct_controls <= n_controls`` every one
of them is used once (``controls_exhaustive``; ``n_controls`` in the summary is then the number used, and
``n_controls_requested`` the number asked for); otherwise ``n_controls`` are drawn uniformly without
replacement: with at most :data:`ENUMERATE_AT_MOST` distinct sets, the first ``n_controls`` of a seeded
random order of all of them (``layer_generator(seed, None, "ablation", 2)``); with more, candidate ``j``
takes the ``j``-th draw of one stream per layer (``layer_generator(seed, l, "ablation")``) and is rejected
when it is the flagged set or an earlier control. Deterministic for ``seed``, and the first ``n`` controls
of a larger ``n_controls`` are the ``n`` controls of a smaller one. With every head of every flagged layer
flagged no control exists: ``n_controls > 0`` is refused (:class:`~tl_idempotence.errors.OptionError`;
``n_controls=0`` measures Δ alone). With fewer than :data:`MIN_CONTROLS_FOR_P_005` (19) distinct sets,
``p <= 0.05`` is impossible: ``summary["controls_warning"]``, the note, ``repr`` and a ``UserWarning`` say so.

**p-value** (what it means, :func:`rank_p_value`): ``(1 + #{controls with Δ ≥ Δ_flagged}) / (n + 1)`` over
the ``n`` distinct controls used, the exact rank test of the flagged set among the matched sets. Under the
null hypothesis that the flagged heads are, for the loss, like a random matched set — the flagged set's Δ
and those of the controls (distinct sets, drawn without replacement) are exchangeable — ``P(p ≤ x) ≤ x``.
It is conditional on the text: every set is evaluated on the same windows, so no
assumption about how tokens or windows depend on each other enters it. Its smallest possible value is
``1/(n + 1)`` (``p_value_floor``): with the default 39 controls 0.025, so a flagged set that beats all
controls, or all but one, gets ``p ≤ 0.05``. NaN with a note when ``n_controls = 0``.

**Effect size and 95 % intervals**: ``excess_over_controls = Δ_flagged − median(Δ_controls)``
(nats per token). ``delta_loss_ci_*`` and ``excess_ci_*`` (:func:`bootstrap_intervals`) are percentile
intervals — the 2.5 % and 97.5 % quantiles (:func:`percentile_interval`, :data:`INTERVAL_LEVEL`) — of
:data:`BOOTSTRAP_DRAWS` seeded bootstrap draws (``layer_generator(seed, None, "ablation", 1)``)
that resample **text windows** in moving blocks of ``ℓ = max(1, round(n_windows^(1/3)))``
consecutive windows (tokens are never resampled one by one: those of a window share their
context, and neighbouring windows come from the same documents), recomputing each set's loss
on the resampled windows; ``excess_ci_*`` also resamples the control **sets** (with
replacement), so it covers both which text was read and which controls were drawn. They
describe uncertainty; the test is the p-value above. With a single window the intervals are
NaN with a note.
"""

from __future__ import annotations

from .controls import ENUMERATE_AT_MOST, MIN_CONTROLS_FOR_P_005, count_matched_sets, matched_controls
from .entry import ABLATION_KINDS, DEFAULT_N_CONTROLS, MAX_CONTROLS, AblationArgs, ablation
from .passes import CHECK_TOLERANCE, next_token_loss, next_token_losses
from .result import Ablation, load_ablation
from .stats import BOOTSTRAP_DRAWS, INTERVAL_LEVEL, bootstrap_intervals, percentile_interval, rank_p_value

__all__ = [
    "ABLATION_KINDS",
    "BOOTSTRAP_DRAWS",
    "CHECK_TOLERANCE",
    "DEFAULT_N_CONTROLS",
    "ENUMERATE_AT_MOST",
    "INTERVAL_LEVEL",
    "MAX_CONTROLS",
    "MIN_CONTROLS_FOR_P_005",
    "Ablation",
    "AblationArgs",
    "ablation",
    "bootstrap_intervals",
    "count_matched_sets",
    "load_ablation",
    "matched_controls",
    "next_token_loss",
    "next_token_losses",
    "percentile_interval",
    "rank_p_value",
]
