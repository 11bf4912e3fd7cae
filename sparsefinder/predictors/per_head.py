"""One raw setting per head: a layer's heads predicted by different settings of one family.

Why: heads differ (a positional head needs a window of 1, a diffuse one hundreds of keys),
so one raw hyperparameter shared by all heads — B and k of k-means, β of quantization, the
window w, the key budget of routed k-means — spends sparsity where it buys little recall.
:mod:`sparsefinder.calibration.grid` chooses a grid index per head on TRAIN graphs; this
module predicts with the choice.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from sparsefinder.predictors.base import Predictor


@dataclass(eq=False)
class PerHeadSelect:
    """Head ``h`` is predicted by ``predictors[choice[h]]`` (all predictors read the same
    inputs: one family on one layer).

    Each predictor that some head uses runs once on all heads, and its masks are kept for
    those heads only, so the cost is the number of distinct settings in the layer times one
    prediction (the calibration's choices are few per layer).
    """

    #: None: a setting that keeps nothing (a window of 0), which builds no predictor
    predictors: Sequence[Predictor | None]
    choice: Tensor  # long (heads,): index into predictors

    returns_fresh_mask: ClassVar[bool] = True  # see base.FreshOutput

    def __post_init__(self) -> None:
        if not isinstance(self.choice, Tensor) or self.choice.dim() != 1:
            raise ValueError("choice must be a 1-d tensor with one predictor index per head")
        if self.choice.numel() and (int(self.choice.min()) < 0
                                    or int(self.choice.max()) >= len(self.predictors)):
            raise ValueError(f"choice must index the {len(self.predictors)} predictors, got "
                             f"{self.choice.tolist()}")

    def predict(self, q: Tensor, k: Tensor, *, causal: bool = False) -> Tensor:
        """q: (heads, n, ·), k: (heads, m, ·) → bool (heads, n, m)."""
        if q.shape[0] != self.choice.shape[0]:
            raise ValueError(f"calibrated for {self.choice.shape[0]} heads, got q with "
                             f"{q.shape[0]}")
        out = torch.zeros(q.shape[0], q.shape[1], k.shape[1], dtype=torch.bool, device=q.device)
        choice = self.choice.to(q.device)
        for index in torch.unique(choice).tolist():
            if self.predictors[index] is None:  # its heads keep nothing
                continue
            heads = choice == index
            out[heads] = self.predictors[index].predict(q, k, causal=causal)[heads]
        return out
