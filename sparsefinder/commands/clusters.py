"""`sparsefinder clusters`: what POS tags fill each k-means cluster of one head (paper Fig. 6).

Writes, for the chosen head, the tag × cluster percentage tables of queries and keys, the
recall/sparsity of the k-means graph per query tag, and one offline HTML page with both
figures (plotly.js inlined: it opens with no network).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go

from sparsefinder.analysis.clusters import HeadClusterAnalysis
from sparsefinder.analysis.pos import align_doc, load_nlp
from sparsefinder.bundle import bundle
from sparsefinder.commands._common import add_corpus_arguments, add_model_arguments, load_from_args
from sparsefinder.data.corpus import corpus_texts
from sparsefinder.data.records import extract
from sparsefinder.figures.clusters import order_tags, pos_recall_figure, queries_keys_figure
from sparsefinder.projections.heads import HeadProjections

_CHUNK = 16  # passages extracted at once: bounds memory on long corpora


def default_projections() -> Path:
    """The bundle's best projections WITH k-means centroids (a shared query/key space: the
    best projections overall, low-rank augmented ones, have no centroids)."""
    return bundle().best("centroids")


def add_projection_arguments(parser: argparse.ArgumentParser) -> None:
    """``--projections`` (shared with `sparsefinder coref`)."""
    parser.add_argument(
        "--projections",
        type=Path,
        default=None,
        help="projections file with k-means centroids (default: the bundle's best with "
             "centroids, assets/default/projections.pt)",
    )


def projections_path(args: argparse.Namespace) -> Path:
    """``--projections``, else the bundle's best projections with centroids."""
    return args.projections if args.projections is not None else default_projections()


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "clusters",
        help="POS-tag breakdown of one head's k-means clusters, and recall per POS tag",
    )
    parser.add_argument("--layer", type=int, required=True, help="layer index (from 0)")
    parser.add_argument("--head", type=int, required=True, help="head index (from 0)")
    add_model_arguments(parser)
    add_corpus_arguments(parser, default_split="validation")
    add_projection_arguments(parser)
    parser.add_argument("--clusters", type=int, default=8, help="number of clusters B")
    parser.add_argument(
        "--top-k",
        type=int,
        default=1,
        help="clusters per token; with k > 1 a token counts once in each of its k clusters",
    )
    parser.add_argument("--out", required=True, type=Path, help="output folder")
    parser.add_argument("--batch-size", type=int, default=8)
    return parser


def tag_records(records: Sequence) -> list[list[str]]:
    """POS tags per subword token of each record (one spaCy ``pipe`` pass over the texts)."""
    docs = load_nlp().pipe([record.text for record in records])
    return [
        align_doc(doc, record.offsets, record.special)
        for doc, record in zip(docs, records, strict=True)
    ]


def write_html(path: Path, figures: Sequence[go.Figure]) -> Path:
    """Several figures in one self-contained page (plotly.js inlined once)."""
    parts = [
        fig.to_html(full_html=False, include_plotlyjs=index == 0)
        for index, fig in enumerate(figures)
    ]
    path.write_text(
        "<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>Sparsefinder clusters"
        "</title></head><body>\n" + "\n".join(parts) + "\n</body></html>\n",
        encoding="utf-8",
    )
    return path


def _ordered(table: pd.DataFrame) -> pd.DataFrame:
    return table.loc[order_tags(list(table.index))]


def run(args: argparse.Namespace) -> int:
    loaded = load_from_args(args)
    projections = HeadProjections.load(
        projections_path(args), expected_model_id=loaded.model_id, expected_alpha=loaded.alpha
    )
    analysis = HeadClusterAnalysis(projections, args.layer, args.head, args.clusters, args.top_k)
    passages = corpus_texts(args.corpus, args.split, loaded.tokenizer, loaded.max_length,
                            args.max_passages)
    for start in range(0, len(passages), _CHUNK):
        records = extract(
            loaded, passages[start : start + _CHUNK], batch_size=args.batch_size, long_text="error"
        )
        for record, tags in zip(records, tag_records(records), strict=True):
            analysis.add(record, tags)
    queries = _ordered(analysis.query_percentages)
    keys = _ordered(analysis.key_percentages)
    scores = analysis.pos_scores
    args.out.mkdir(parents=True, exist_ok=True)
    queries.round(4).to_csv(args.out / "clusters_queries.csv")
    keys.round(4).to_csv(args.out / "clusters_keys.csv")
    scores.to_csv(args.out / "pos_recall.csv")
    where = f"layer {args.layer} head {args.head}, B={args.clusters}, top-k={args.top_k}"
    tokens = scores["tokens"]
    write_html(
        args.out / "clusters.html",
        [
            queries_keys_figure(
                queries,
                keys,
                title=f"POS tags per cluster — {where}",
                query_counts=tokens,
                key_counts=tokens,
            ),
            pos_recall_figure(scores, title=f"k-means recall and sparsity per query tag — {where}"),
        ],
    )
    total = scores[["tokens", "gold", "hit", "predicted", "allowed"]].sum()
    print(
        f"{where}: {analysis.n_records} texts, {int(total['tokens'])} tokens, "
        f"recall {total['hit'] / max(total['gold'], 1):.3f}, "
        f"sparsity {1 - total['predicted'] / max(total['allowed'], 1):.3f} (pooled)"
    )
    print("worst-served query tags (micro recall within tag):")
    print(scores.head(5)[["tokens", "recall", "sparsity"]].to_string(float_format="%.3f"))
    names = "clusters_queries.csv, clusters_keys.csv, pos_recall.csv, clusters.html"
    print(f"wrote {names} to {args.out}")
    return 0
