"""sparsefinder.projections.hash_code_table: the hash-codes file, its checks and the bundled
asset."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from sparsefinder.bundle import bundle
from sparsefinder.models.loading import DEFAULT_MODEL_ID, SOFTMAX_MODEL_ID
from sparsefinder.projections.hash_code_table import (
    HashCodesError,
    HashCodeTable,
    bundled_hash_codes,
)


def _table(layers: int = 2, heads: int = 3, d: int = 4, bits: int = 5) -> HashCodeTable:
    gen = torch.Generator().manual_seed(0)
    maps = [(torch.randn(heads, d, bits, generator=gen), torch.randn(heads, d, bits,
                                                                      generator=gen))
            for _ in range(layers)]
    return HashCodeTable(model_id="m", alpha=1.5, maps=maps, metadata={"split": "train"})


def test_save_and_load_round_trip(tmp_path: Path) -> None:
    table = _table()
    loaded = HashCodeTable.load(table.save(tmp_path / "codes.pt"), expected_model_id="m")
    assert loaded.model_id == "m" and loaded.alpha == 1.5
    assert loaded.metadata == {"split": "train"}
    for (q0, k0), (q1, k1) in zip(table.maps, loaded.maps, strict=True):
        assert torch.equal(q0, q1) and torch.equal(k0, k1)


def test_every_bad_file_is_a_clear_error(tmp_path: Path) -> None:
    path = _table().save(tmp_path / "codes.pt")
    with pytest.raises(HashCodesError, match="not 'other'.*fit-hash-codes"):
        HashCodeTable.load(path, expected_model_id="other")
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes(path.read_bytes()[:100])
    with pytest.raises(HashCodesError, match="not a readable hash-codes file"):
        HashCodeTable.load(truncated)
    foreign = tmp_path / "foreign.pt"
    torch.save({"weight": torch.zeros(2)}, foreign)
    with pytest.raises(HashCodesError, match="is not a hash-codes file.*sparsefinder-hash-codes"):
        HashCodeTable.load(foreign)
    with pytest.raises(HashCodesError, match="no hash-codes file"):
        HashCodeTable.load(tmp_path / "missing.pt")


def test_maps_of_mixed_shapes_are_refused() -> None:
    table = _table()
    with pytest.raises(HashCodesError, match="layer 1"):
        HashCodeTable(model_id="m", alpha=1.5, maps=[table.maps[0], (torch.zeros(3, 4, 6),
                                                                      torch.zeros(3, 4, 6))])
    with pytest.raises(HashCodesError, match="at least one layer"):
        HashCodeTable(model_id="m", alpha=1.5, maps=[])


def test_the_bundled_codes_serve_the_default_model_only() -> None:
    assert bundle().path("hash codes").is_file()
    table = bundled_hash_codes(DEFAULT_MODEL_ID)
    assert table is not None and len(table.maps) == 6
    assert table.maps[0][0].shape == (12, 32, 16)
    assert table.metadata["split"] == "train"
    assert bundled_hash_codes(SOFTMAX_MODEL_ID) is None  # fitted on the adapted model's graphs
