"""Which of the app's families run on a prepared text.

Every family is asked the same way, so none is named here: the calibrated forms the text's
table holds, then each family of the method menu built at the values its sliders open on
(:func:`.text_ranges.fit`) with the parts it declared (:meth:`.PreparedText.parts_for`). A
family whose slider has no value on this text (k-means without centroids), or whose build
lacks a part (HashAttention without codes for this model, any learned family without
projections), is left out.
"""

from __future__ import annotations

from sparsefinder.explore.app_methods import APP_METHODS
from sparsefinder.explore.prepared import CALIBRATED_APP_METHODS, PreparedText
from sparsefinder.explore.state import ViewState, to_spec
from sparsefinder.explore.text_ranges import fit


def available_methods(prepared: PreparedText) -> list[str]:
    """The methods that run on ``prepared``, written with their calibration, in menu order
    (the calibrated forms first). Computed once per text and stored whole: sessions share a
    prepared text, and one must never read another's half-built list."""
    if prepared.available is None:
        prepared.available = [*_calibrated(prepared),
                              *(f for f in APP_METHODS if _runs(prepared, f))]
    return list(prepared.available)


def _calibrated(prepared: PreparedText) -> list[str]:
    table = prepared.calibration
    if table is None or not (prepared.has_projections or prepared.calibrated_vectors):
        return []
    return [m for m in CALIBRATED_APP_METHODS if table.has(m)]


def _runs(prepared: PreparedText, family: str) -> bool:
    state = ViewState(method=family)
    try:  # the raw form (as written: the family's name), at the values it opens on
        spec = to_spec(state.with_(**fit(prepared, state)), method=family)
        if spec.needs_projections and not prepared.has_projections:
            return False
        spec.build(prepared.parts_for(spec), 0)
    except ValueError:  # no value fits its slider here, or a declared part is missing
        return False
    return True
