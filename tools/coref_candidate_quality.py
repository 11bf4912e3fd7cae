"""Precision/recall of the own-text pronoun → antecedent candidates on the bundled probes.

    PYTHONPATH=$PWD .venv/bin/python tools/coref_candidate_quality.py

The probes' hand annotation is the only reference the candidate rules and word lists were
checked against, so these are numbers of a heuristic on its own reference, not a held-out score.
"""

from __future__ import annotations

from sparsefinder.analysis.coref import load_probes
from sparsefinder.analysis.coref_pairs import candidate_quality


def main() -> None:
    probes = load_probes()
    # the first 41 probes are those the rules and word lists were checked against; the rest
    # were written after the rules were fixed (unseen by them), the fresh set last of all
    later = [p for p in probes[41:] if p.set is None]
    fresh = [p for p in probes[41:] if p.set == "fresh"]
    for part, chosen in (("probes 1-41", probes[:41]), (f"{len(later)} later probes", later),
                         (f"{len(fresh)} fresh probes", fresh)):
        for per_pronoun in (1, 2):
            _report(part, chosen, per_pronoun)


def _report(part: str, probes: list, per_pronoun: int) -> None:
    if probes:
        q = candidate_quality(probes, per_pronoun=per_pronoun)
        print(f"{part}, per_pronoun={per_pronoun}: precision {q['precision']:.3f} "
              f"({q['proposed']} proposed), recall {q['recall']:.3f} "
              f"(anaphora only {q['recall_anaphora']:.3f}; {q['annotated']} annotated pairs)")


if __name__ == "__main__":
    main()
