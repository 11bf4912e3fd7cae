"""`sparsefinder adapt --evaluate`: measure an entmax adapter without training.

Pooled cosine of the adapted entmax model to the softmax model it was distilled from, and its
gold sparsity, on the default corpus's validation split and on every ``--eval-corpus``:
``narrative`` (the bundled hand-written story and news hold-out, all passages) or a
.txt/.jsonl/folder (all its passages: give text that was not trained on).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from sparsefinder.adaptation.distill import Fidelity, measure, softmax_teacher
from sparsefinder.data.corpus import default_corpus, load_texts
from sparsefinder.models.loading import DEFAULT_MODEL, SOFTMAX_MODEL, load_model

NARRATIVE = "narrative"


def eval_sets(corpora: Sequence[str], eval_passages: int | None = None,
              validation: bool = True) -> dict[str, list[str]]:
    """``{label: texts}``: the default corpus's validation split (at most ``eval_passages``)
    and each of ``corpora`` (``"narrative"``: the bundled hold-out)."""
    from sparsefinder.bundle import narrative_holdout

    sets: dict[str, list[str]] = {}
    if validation:
        sets["default corpus, validation split"] = default_corpus("validation")[:eval_passages]
    for corpus in corpora:
        if corpus == NARRATIVE:
            sets["narrative hold-out (bundled)"] = load_texts(narrative_holdout())
        else:
            sets[f"{corpus} (all passages)"] = load_texts(corpus)
    return sets


def evaluate(model: str, adapter: str | Path | None, sets: dict[str, list[str]],
             alpha: float | None = None, device: str = "auto") -> dict[str, Fidelity]:
    """Measure ``model`` with ``adapter`` (``"default"`` without one: the bundled adapter)
    against its own softmax self on each text set."""
    base_name = SOFTMAX_MODEL if model == DEFAULT_MODEL else model
    teacher_base = load_model(base_name, alpha=alpha, device=device)
    student = load_model(model, alpha=alpha, device=device, adapter=adapter)
    teacher = softmax_teacher(teacher_base.model)
    return {label: measure(student.model, teacher, student.tokenizer, texts, student.device,
                           student.max_length)
            for label, texts in sets.items()}


def report(results: dict[str, Fidelity], file=None) -> None:
    file = file or sys.stdout
    for label, fid in results.items():
        print(f"{label}: {len(fid.cosines)} texts, pooled cosine mean {fid.mean_cosine:.4f} "
              f"min {fid.min_cosine:.4f}, gold sparsity {fid.sparsity:.4f} per layer "
              + " ".join(f"{float(s):.3f}" for s in fid.layer_sparsity), file=file)
