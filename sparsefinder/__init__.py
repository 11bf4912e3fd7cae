"""Sparsefinder: predict and explore the sparsity of α-entmax attention in transformers.

The public API, in the order of the data flow::

    import sparsefinder as sf
    from sparsefinder.bundle import bundle           # the bundled files, by manifest

    lm = sf.load_model("default")                    # α-entmax attention, offline
    (record,) = sf.extract(lm, "The doctor said she would call back.")   # gold graphs
    projections = sf.HeadProjections.load(bundle().best("centroids"))
    spec = sf.PredictorSpec.of("kmeans", {"n_clusters": 8, "top_k": 2}, window=3)
    masks = sf.predict_record(spec, spec.build_layers(projections, record.num_layers),
                              sf.RecordInputs(record, projections))
    scores = sf.Scorer(record).score(masks)          # recall / sparsity per (layer, head)

Names resolve on first use (PEP 562), so ``import sparsefinder`` stays light: torch,
transformers and the rest load when a name that needs them is first touched.
"""

from __future__ import annotations

import importlib
from typing import Any

#: Public name → the module that defines it.
_EXPORTS: dict[str, str] = {
    "load_model": "sparsefinder.models.loading",
    "LoadedModel": "sparsefinder.models.loading",
    "load_corpus": "sparsefinder.data.corpus",
    "extract": "sparsefinder.data.records",
    "AttentionRecord": "sparsefinder.data.records",
    "HeadProjections": "sparsefinder.projections.heads",
    "METHODS": "sparsefinder.methods.registry",
    "Method": "sparsefinder.methods.registry",
    "Param": "sparsefinder.methods.registry",
    "register_method": "sparsefinder.methods.registry",
    "PredictorSpec": "sparsefinder.methods.spec",
    "LearnedParts": "sparsefinder.learned_parts",
    "RecordInputs": "sparsefinder.methods.spec",
    "predict_record": "sparsefinder.methods.spec",
    "Scorer": "sparsefinder.metrics.scorer",
    "sweep": "sparsefinder.evaluation.sweep",
    "pareto_frontier": "sparsefinder.evaluation.frontier",
    "restrict": "sparsefinder.evaluation.restricted",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'sparsefinder' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
