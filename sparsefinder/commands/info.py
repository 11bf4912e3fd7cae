"""`sparsefinder info`: what model would be used, with which shapes, α and device, and
every layer's α and kind (global/local, entmax/softmax)."""

from __future__ import annotations

import argparse

from sparsefinder.commands._common import add_model_arguments, load_from_args
from sparsefinder.models.recipes import LayerPlan


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "info", help="print model, layers, heads, head dim, alpha (per layer), device"
    )
    add_model_arguments(parser)
    return parser


def run(args: argparse.Namespace) -> int:
    loaded = load_from_args(args)
    for key, value in loaded.describe().items():
        print(f"{key:>10}: {value}")
    plans = loaded.layers or [LayerPlan(i, loaded.alpha, False, None)
                              for i in range(loaded.num_layers)]
    for plan in plans:
        print(f"{'layer ' + str(plan.layer):>10}: {plan.describe(loaded.causal)}")
    softmax = sum(plan.softmax for plan in plans)
    if softmax:
        print(f"{softmax} softmax layer(s): dense gold graphs, left out of predictor training "
              "and of macro averages")
    return 0
