"""Graph predictors: each maps projected queries/keys to a bool attention mask.

Add new predictors (e.g. baselines) by importing them here and listing them in ``__all__``.
"""

from sparsefinder.predictors.base import Predictor
from sparsefinder.predictors.bigbird import BigBird
from sparsefinder.predictors.block import BlockSparsefinder, LearnedBlockSparsefinder
from sparsefinder.predictors.distance import Distance
from sparsefinder.predictors.global_tokens import GlobalTokens
from sparsefinder.predictors.kmeans import KMeans
from sparsefinder.predictors.longformer import Longformer
from sparsefinder.predictors.quantization import Quantization
from sparsefinder.predictors.reformer import Reformer
from sparsefinder.predictors.routed_kmeans import RoutedKMeans
from sparsefinder.predictors.routing import Routing
from sparsefinder.predictors.sparsebert import NoDiagonal, StaticMask
from sparsefinder.predictors.topk import TopK
from sparsefinder.predictors.topp import TopP
from sparsefinder.predictors.union import Union
from sparsefinder.predictors.window import Window

__all__ = [
    "Predictor",
    "Distance",
    "Quantization",
    "KMeans",
    "Window",
    "GlobalTokens",
    "Union",
    "Longformer",
    "BigBird",
    "Reformer",
    "Routing",
    "TopK",
    "NoDiagonal",
    "StaticMask",
    "RoutedKMeans",
    "TopP",
    "BlockSparsefinder",
    "LearnedBlockSparsefinder",
]
