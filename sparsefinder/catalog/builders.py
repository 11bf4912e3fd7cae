"""The builders and fitters of the learned families (what a catalog entry's ``build`` and
``fit`` call): each reads the learned part its family declares, or says how to get it."""

from __future__ import annotations

import copy
import functools
from collections.abc import Sequence
from typing import Any

import torch

from sparsefinder.data.records import AttentionRecord
from sparsefinder.methods.registry import (
    BuildContext,
    Builder,
    MethodUnavailable,
    Params,
)
from sparsefinder.predictors import Distance, NoDiagonal, StaticMask
from sparsefinder.predictors.base import Predictor
from sparsefinder.predictors.block import LearnedBlockSparsefinder
from sparsefinder.predictors.hash_codes import HammingCodes
from sparsefinder.predictors.row_floor import RowFloor
from sparsefinder.predictors.row_fraction import RowFraction
from sparsefinder.projections.blocks import (
    check_block_projections,
    train_block_projections_by_size,
)
from sparsefinder.projections.hash_code_table import HashCodesError
from sparsefinder.projections.hash_fit import fit_hash_codes
from sparsefinder.projections.heads import HeadProjections, ProjectionsError
from sparsefinder.projections.key_codebooks import CodebooksError, bundled_codebooks


def _unavailable_on_file_errors(build: Builder) -> Builder:
    """A builder whose missing learned part (a file error) reads as "not available here"."""

    @functools.wraps(build)
    def wrapped(params: Params, context: BuildContext) -> Predictor | None:
        try:
            return build(params, context)
        except (ProjectionsError, CodebooksError, HashCodesError) as error:
            raise MethodUnavailable(str(error)) from error

    return wrapped


def _require_projections(context: BuildContext, what: str) -> HeadProjections:
    if context.projections is None:
        raise ValueError(
            f"{what} needs learned projections for this model; train them with "
            "`sparsefinder train --model NAME --out DIR` and pass the projections file"
        )
    return context.projections


def _require_fitted(context: BuildContext, hint: str = "", part: str = "fitted") -> Any:
    value = getattr(context.parts, part)
    if value is None:
        raise ValueError("this method is learned from training graphs; pass train_records=..."
                         + hint)
    return value


def _training_graphs(
    train_records: Sequence[AttentionRecord], what: str
) -> Sequence[AttentionRecord]:
    """``train_records``, or the error a learned method gives when it has none."""
    if not train_records:
        raise ValueError(f"{what} are learned from training graphs; pass train_records=...")
    return train_records


# ------------------------------------------------------------------ builders and fitters

def _kmeans(p: Params, c: BuildContext) -> Predictor:
    projections = _require_projections(c, "k-means")
    return projections.kmeans(c.layer, int(p["n_clusters"]), top_k=int(p.get("top_k", 1)))


def _routed_kmeans(p: Params, c: BuildContext) -> Predictor:
    """Routed k-means from the key codebooks of the projections' model (the bundled ones when
    the parts hold none): ``mode`` ``budget`` keeps a share of the keys, ``top`` the keys of
    the ``n_routes`` nearest clusters."""
    if c.projections is None:  # its model_id tells which model's codebooks apply
        raise CodebooksError("kmeans-routed needs the model's projections to know its "
                             "model id; pass projections=...")
    books = c.parts.codebooks or bundled_codebooks(model_id=c.projections.model_id)
    if c.projections.model_id != books.model_id:
        raise CodebooksError(
            f"the bundled key codebooks are for {books.model_id!r}, not "
            f"{c.projections.model_id!r}; fit some with `sparsefinder fit-codebooks`"
        )
    mode = p.get("mode") or "budget"
    needed = "n_routes" if mode == "top" else "budget"
    if p.get(needed) is None:
        raise ValueError(f"kmeans-routed with mode={mode!r} takes {needed}")
    if mode == "top":
        return books.predictor(c.layer, int(p["n_clusters"]), mode="top",
                               n_routes=int(p["n_routes"]))
    return books.predictor(c.layer, int(p["n_clusters"]), budget=float(p["budget"]))


def _row_fraction(p: Params, c: BuildContext) -> Predictor:
    projections = _require_projections(c, "nearest keys (rowfrac)")
    return RowFraction(torch.full((projections.num_heads,), float(p["fraction"])))


def _static_masks_fit(train_records: Sequence[AttentionRecord],
                      kind: str = "structured") -> list[StaticMask]:
    """``fit`` of SparseBERT's static masks: one ``StaticMask(kind)`` per layer, fitted on the
    training gold graphs; each grid point gets a copy re-targeted to its sparsity."""
    if not train_records:
        raise ValueError(f"sparsebert ({kind}) masks are fitted on training graphs; "
                         "pass train_records=...")
    causal = train_records[0].causal
    return [
        StaticMask(kind, 0.5).fit([r.layers[layer].gold for r in train_records], causal=causal)
        for layer in range(train_records[0].num_layers)
    ]


def _static_mask(p: Params, c: BuildContext) -> Predictor:
    # A shallow copy shares the learned (read-only) tensors; its keep() cache is keyed by the
    # target, so the copy recomputes it for its own target.
    mask = copy.copy(_require_fitted(c)[c.layer])
    kind = p.get("kind") or "structured"
    if mask.kind != kind:
        raise ValueError(f"the fitted masks are {mask.kind}, this setting asks for {kind}; "
                         "fit the spec itself (spec.fit(train_records))")
    mask.target_sparsity = float(p["target_sparsity"])
    mask._check_target()
    return mask


def _hash_codes_fit(train_records: Sequence[AttentionRecord]) -> Any:
    return fit_hash_codes(_training_graphs(train_records, "hashattention codes"))


def _hash_codes(p: Params, c: BuildContext) -> Predictor:
    w_query, w_key = _require_fitted(c, part="hash_codes")[c.layer]
    return HammingCodes(w_query, w_key, int(p["max_distance"]))


def _block_projections_fit(train_records: Sequence[AttentionRecord]) -> Any:
    return train_block_projections_by_size(
        _training_graphs(train_records, "block-learned projections"))


def _learned_block(p: Params, c: BuildContext) -> Predictor:
    """``parts.block_projections``: block projections by block size (the fit's result or the
    bundled ones), or one size's projections."""
    fitted_all = _require_fitted(c, " (or the bundled block projections in Parts)",
                                 part="block_projections")
    block = int(p["block"])
    fitted = fitted_all.get(block) if isinstance(fitted_all, dict) else fitted_all
    if fitted is None:
        raise ValueError(f"no block projections for blocks of {block} tokens (fitted: "
                         f"{sorted(fitted_all)}); train them with `sparsefinder "
                         f"fit-block-projections --block {block}`")
    check_block_projections(fitted, block)
    return LearnedBlockSparsefinder(fitted.weight[c.layer], block, int(p["n_blocks"]))


def _distance(p: Params, c: BuildContext) -> Predictor:
    """Distance (t); ``diag`` False drops the diagonal (SparseBERT's ablation), a ``floor``
    (> 0) adds each row's nearest keys (no row left without support)."""
    predictor: Predictor = Distance(float(p["threshold"]))
    if p.get("diag") is False:
        predictor = NoDiagonal(predictor)
    if p.get("floor"):  # left out or 0: no floor
        predictor = RowFloor(predictor, int(p["floor"]))
    return predictor

