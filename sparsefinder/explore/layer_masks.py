"""A setting's masks of every layer, predicted when read, with at most a memory budget held.

Why: the app scores every head of every layer on a slider move (the model's numbers and the
layer × head grid need them), but shows one head's mask. Holding every layer's masks costs
``layers · heads · n²`` bytes: 2 GiB for a ~1 B decoder at 2048 tokens, for each setting the
app keeps. Here the scorer reads the layers in turn (each is predicted, scored, and dropped
once the budget is full) and a view that reads a layer again gets it predicted again (one
layer: ~0.1 s at that size), so a setting costs its scores plus a few layers. Short texts
keep every layer: their masks fit the budget many times over.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence

from torch import Tensor

#: Bytes of masks one setting may hold (the last layers read).
MASK_BUDGET = 512 * 2**20


class LazyMasks(Sequence[Tensor]):
    """``masks[layer]``: bool (heads, n, m), from ``predict(layer)`` on first read; the most
    recently read layers are held while they fit ``budget`` bytes (at least two: the
    selected head's layer and the one compared with it). Safe to share between threads
    (sessions of the app read one cached setting)."""

    def __init__(self, predict: Callable[[int], Tensor], num_layers: int,
                 layer_bytes: int, budget: int = MASK_BUDGET) -> None:
        self._predict = predict
        self._layers = int(num_layers)
        self.keep = max(2, int(budget) // max(1, int(layer_bytes)))
        self._held: OrderedDict[int, Tensor] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return self._layers

    def __getitem__(self, layer):  # type: ignore[override]
        if isinstance(layer, slice):
            return [self[i] for i in range(*layer.indices(self._layers))]
        layer = int(layer)
        if not -self._layers <= layer < self._layers:
            raise IndexError(f"layer {layer} out of range for {self._layers} layers")
        layer %= self._layers
        with self._lock:
            mask = self._held.get(layer)
            if mask is None:
                mask = self._predict(layer)
                self._held[layer] = mask
                while len(self._held) > self.keep:
                    self._held.popitem(last=False)
            self._held.move_to_end(layer)
            return mask

    @property
    def held(self) -> list[int]:
        """The layers held now, least recently read first."""
        return list(self._held)
