"""Records round-trip through the compact on-disk format; bad files give clear errors."""

from __future__ import annotations

import pytest
import torch

from sparsefinder.data.records import extract
from sparsefinder.data.records_io import RecordsFileError, load_records, save_records


def test_round_trip_is_exact(default_model, tmp_path):
    records = extract(default_model, ["A first passage.", "And a second, longer passage here."])
    path = save_records(records, tmp_path / "sub" / "r.pt", metadata={"model_id": "m"})
    loaded, metadata = load_records(path)
    assert metadata == {"model_id": "m"}
    for a, b in zip(records, loaded, strict=True):
        assert (a.text, a.tokens, a.offsets, a.special) == (b.text, b.tokens, b.offsets, b.special)
        for la, lb in zip(a.layers, b.layers, strict=True):
            assert torch.equal(la.gold, lb.gold) and torch.equal(la.queries, lb.queries)
            assert torch.equal(la.prob_values, lb.prob_values) and la.scaling == lb.scaling
    # Edge lists are far smaller than dense float probabilities would be.
    dense_bytes = sum(layer.gold.numel() * 4 for r in records for layer in r.layers)
    edge_bytes = sum(layer.gold.sum().item() * 10 for r in records for layer in r.layers)
    assert edge_bytes < dense_bytes


def test_missing_corrupt_and_foreign_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="sparsefinder extract"):
        load_records(tmp_path / "nope.pt")
    corrupt = tmp_path / "corrupt.pt"
    corrupt.write_bytes(b"not a torch file at all")
    with pytest.raises(RecordsFileError, match="not a readable"):
        load_records(corrupt)
    foreign = tmp_path / "foreign.pt"
    torch.save({"weights": torch.zeros(2)}, foreign)
    with pytest.raises(RecordsFileError, match="not a sparsefinder records file"):
        load_records(foreign)
    old = tmp_path / "old.pt"
    torch.save({"format": "sparsefinder-records", "version": 99, "records": []}, old)
    with pytest.raises(RecordsFileError, match="version 99"):
        load_records(old)
