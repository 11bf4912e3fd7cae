"""The typed bundle a predictor is built from besides its parameters: :class:`Parts`.

A family declares once which learned parts it needs (``Method.needs``, among :data:`NEEDS`)
and which one its ``fit`` makes (``Method.fits``). Whoever holds the parts — a sweep that fit
them on TRAIN graphs, the bundle, the app — hands a spec's ``build`` one :class:`Parts`, and
the build sees only the fields the family declared. No caller looks a part up by family name.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sparsefinder.projections.heads import HeadProjections

#: The learned parts a family may declare it needs: ``projections`` (the learned space, with
#: k-means centroids), ``calibration`` (a calibration's fitted per-head settings: from a table
#: or a fit), ``codebooks`` (routed k-means' key codebooks), ``hash_codes`` (HashAttention's
#: per-layer ``(w_query, w_key)``), ``block_projections`` (by block size) and ``fitted`` (what
#: the family's own ``fit`` returned, when it is none of these: SparseBERT's masks, a plug-in's).
NEEDS: tuple[str, ...] = ("projections", "calibration", "codebooks", "hash_codes",
                          "block_projections", "fitted")


@dataclass(frozen=True)
class Parts:
    """What a spec's ``build`` receives besides its parameters; None: not at hand (a build
    that needs it says what is missing and how to get it)."""

    projections: HeadProjections | None = None
    calibration: Any = None
    codebooks: Any = None
    hash_codes: Any = None
    block_projections: Mapping[int, Any] | None = None
    fitted: Any = None

    def only(self, needs: tuple[str, ...] | None) -> Parts:
        """The bundle cut to ``needs`` (None: everything, for families that declare nothing)."""
        if needs is None:
            return self
        return Parts(**{name: getattr(self, name) for name in needs})

    def with_fit(self, slot: str, value: Any) -> Parts:
        """This bundle with a fit's result in ``slot`` (the part the family's ``fit`` makes)."""
        return dataclasses.replace(self, **{slot: value})


def check_needs(needs: tuple[str, ...] | None, fits: str) -> None:
    """Raise a ValueError when a declaration names a part that does not exist."""
    bad = [n for n in (needs or ()) if n not in NEEDS]
    if bad or fits not in NEEDS:
        raise ValueError(f"needs and fits must be among {NEEDS}, got {bad or [fits]}")
