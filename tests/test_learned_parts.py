"""sparsefinder.learned_parts: one resolver of what a method is built from."""

from __future__ import annotations

import pytest
import torch

from sparsefinder.bundle import bundle
from sparsefinder.learned_parts import LearnedParts
from sparsefinder.methods.parts import Parts
from sparsefinder.methods.spec import PredictorSpec
from sparsefinder.projections.heads import HeadProjections

MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2+entmax-adapter"


@pytest.fixture(scope="module")
def parts() -> LearnedParts:
    paper = HeadProjections.load(bundle().path("projections.pt"))
    return LearnedParts.bundled(MODEL_ID, paper)


def test_the_bundle_holds_every_learned_part_of_the_default_model(parts):
    assert parts.calibration is not None and parts.hash_codes is not None
    assert parts.calibration_projections.model_id == MODEL_ID
    assert sorted(parts.block_projections) == [16, 32]
    other = LearnedParts.bundled("someone/else")
    assert (other.calibration, other.hash_codes, other.block_projections) == (None, None, None)


def test_each_method_gets_the_part_it_takes(parts):
    spec = PredictorSpec.of("distance", {"target_sparsity": 0.9}, calibration="budget")
    bundle = parts.for_method(spec)
    projections = bundle.projections
    assert projections is parts.calibration_projections  # the table's own, not the paper's
    built = bundle.calibration({"target_sparsity": 0.9}, projections, 2)
    expected = parts.calibration.predictor("distance", 0.9, 2)
    assert torch.equal(built.sq_thresholds, expected.sq_thresholds)
    assert parts.for_method("distance-budget").projections is projections  # old name, no warning
    # each family gets what it declared and nothing else (no name looked at)
    assert parts.for_method("distance") == Parts(projections=parts.projections)
    assert parts.for_method("hashattention") == Parts(hash_codes=parts.hash_codes.maps)
    assert parts.for_method("block-learned") == Parts(block_projections=parts.block_projections)
    assert parts.for_method("quest") == Parts()
    assert parts.fitted("hashattention") is parts.hash_codes.maps
    assert parts.fitted("distance") is None
    layers = parts.build_layers(spec, 6)
    assert len(layers) == 6 and torch.equal(layers[2].sq_thresholds, expected.sq_thresholds)


def test_a_calibrated_form_the_table_lacks_says_what_is_missing(parts):
    spec = PredictorSpec.of("kmeans", {"target_sparsity": 0.9}, calibration="budget")
    assert parts.for_method(spec) == Parts(projections=parts.projections)
    with pytest.raises(ValueError, match="fitted on training graphs; pass train_records"):
        parts.build_layers(spec, 6)
