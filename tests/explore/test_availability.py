"""Which families run on a text: each asked the same way (built at the values its sliders
open on, with its declared parts), so a family's learned parts switch it on and off."""

from __future__ import annotations

import dataclasses

from sparsefinder.explore import prepared as prep
from sparsefinder.explore.app_methods import APP_METHODS
from sparsefinder.explore.availability import available_methods


def test_the_learned_parts_a_text_holds_switch_families_on_and_off(record, projections):
    full = available_methods(prep.prepare(record, projections))
    assert {"distance", "quantization", "kmeans", "quest", "window"} <= set(full)
    assert "hashattention" not in full  # no codes for this model
    assert full == [f for f in APP_METHODS if f in full]  # menu order

    no_centroids = dataclasses.replace(projections, centroids={})
    without = available_methods(prep.prepare(record, no_centroids))
    assert "kmeans" not in without  # its B slider has no value on this text
    assert {"distance", "quantization", "quest"} <= set(without)

    bare = available_methods(prep.prepare(record, None))
    assert not {"distance", "quantization", "kmeans", "block"} & set(bare)
    assert {"quest", "window", "topk"} <= set(bare)  # own q/k or the shape only


def test_the_list_is_computed_once_per_text_and_handed_out_as_a_copy(record, projections):
    prepared = prep.prepare(record, projections)
    first = available_methods(prepared)
    first.append("not a method")
    assert "not a method" not in available_methods(prepared)
    assert prepared.available is not None
