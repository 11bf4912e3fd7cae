"""Per-layer α: which layers run α-entmax, which keep softmax, and where each α comes from.

Why per layer: the field's entmax checkpoints do not all run entmax everywhere.
SparseModernBERT (``sardinelab/SparseModernBERT-alpha1.5`` / ``-alpha2.0``) was trained
with α-entmax on ModernBERT's *global* layers only; its sliding-window *local* layers kept
softmax. Running entmax on those layers would be a different model, and counting their
(dense) softmax graphs in averages would mix two kinds of attention.

The α of every layer is resolved once, at load time, from (strongest first):

1. the user's per-layer list (``alpha_layers``, CLI ``--alpha-layers 1,1.5,…``): taken as is;
2. one α — the user's (``alpha``, CLI ``--alpha``), else the model's own config (the keys
   the sparse checkpoints' training code writes: ``initial_alpha``, then ``alpha``, then
   ``entmax_alpha``), else :data:`DEFAULT_ALPHA` — spread over the layers by a *recipe*:

   - ``uniform``: α on every layer (BERT, RoBERTa and sparse-RoBERTa, GPT-2, Llama, …);
   - ``global-only``: α on global layers, softmax (α = 1) on local (sliding-window) layers
     (ModernBERT, i.e. SparseModernBERT's training code).

The recipe is the family's (:data:`FAMILY_RECIPES`, else ``uniform``), unless the config
names one under :data:`RECIPE_KEY`; an unknown name is refused with the known ones listed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from torch import nn

from sparsefinder.attention.entmax_ops import validate_alpha

DEFAULT_ALPHA = 1.5
#: Config keys holding a model's own α, in the order they are read (``initial_alpha`` is
#: what the SparseModernBERT / sparse-RoBERTa attention modules read).
CONFIG_ALPHA_KEYS: tuple[str, ...] = ("initial_alpha", "alpha", "entmax_alpha")
#: Config key that names a recipe explicitly (e.g. ``"global-only"``).
RECIPE_KEY = "entmax_recipe"
RECIPES: dict[str, str] = {
    "uniform": "α on every layer",
    "global-only": "α on global layers, softmax (α = 1) on local sliding-window layers",
}
FAMILY_RECIPES: dict[str, str] = {"modernbert": "global-only"}


class AlphaError(ValueError):
    """The per-layer α cannot be resolved; the message says what is wrong and the fix."""


@dataclass(frozen=True)
class LayerPlan:
    """One layer's attention: its α, whether it is local, and its window W (see masks)."""

    layer: int
    alpha: float
    local: bool
    window: int | None

    @property
    def softmax(self) -> bool:
        return self.alpha == 1.0

    def describe(self, causal: bool) -> str:
        """E.g. ``global, entmax α=1.5`` or ``local ±64, softmax``."""
        kind = "global"
        if self.local and self.window:
            kind = f"local {'-' if causal else '±'}{self.window - 1}"
        elif self.local:
            kind = "local"
        rule = "softmax" if self.softmax else f"entmax α={self.alpha:g}"
        return f"{kind}, {rule}"


def parse_alpha_layers(text: str) -> tuple[float, ...]:
    """``"1,1.5,1.5"`` → (1.0, 1.5, 1.5); a clear error for anything else (CLI type)."""
    parts = [part.strip() for part in str(text).split(",")]
    try:
        values = tuple(float(part) for part in parts)
    except ValueError:
        raise AlphaError(
            f"--alpha-layers must be comma-separated numbers, one α per layer "
            f"(e.g. 1,1.5,1.5), got {text!r}"
        ) from None
    return values


def config_alpha(config: object) -> tuple[float, str] | None:
    """The model's own α and the key it came from, or None when the config has none."""
    for key in CONFIG_ALPHA_KEYS:
        value = getattr(config, key, None)
        if isinstance(value, int | float) and not isinstance(value, bool):
            try:
                return validate_alpha(value), key
            except ValueError as error:
                raise AlphaError(f"the model's config has {key}={value!r}: {error}; "
                                 "override it with --alpha or --alpha-layers") from None
    return None


def config_recipe(config: object) -> str:
    """The recipe the config names, else its family's, else ``uniform``."""
    named = getattr(config, RECIPE_KEY, None)
    if named is not None:
        if named not in RECIPES:
            known = "; ".join(f"{name!r} ({what})" for name, what in RECIPES.items())
            raise AlphaError(
                f"the model's config names the attention recipe {named!r} under "
                f"{RECIPE_KEY!r}, which sparsefinder does not know; known recipes: {known}. "
                "Give every layer its α yourself with --alpha-layers (e.g. 1,1.5,1,1.5)"
            )
        return str(named)
    return FAMILY_RECIPES.get(str(getattr(config, "model_type", "")), "uniform")


def local_layers(model: nn.Module) -> dict[int, int | None]:
    """``{layer: window}`` of the local layers: the W each attention module hands the
    attention function (``module.sliding_window``), from ``config.layer_types``."""
    config = model.config
    types = getattr(config, "layer_types", None) or []
    windows: dict[int, int] = {}
    for module in model.modules():
        index, window = getattr(module, "layer_idx", None), getattr(module, "sliding_window",
                                                                      None)
        if isinstance(index, int) and isinstance(window, int) and not isinstance(window, bool):
            windows[index] = window
    fallback = getattr(config, "sliding_window", None)
    return {i: windows.get(i, int(fallback) if fallback else None)
            for i, kind in enumerate(types) if kind == "sliding_attention"}


def resolve_alphas(model: nn.Module, num_layers: int, alpha: float | None = None,
                   alpha_layers: Sequence[float] | None = None
                   ) -> tuple[list[LayerPlan], str, str]:
    """Every layer's :class:`LayerPlan`, the recipe used and where α came from."""
    config = model.config
    local = local_layers(model)
    if alpha_layers is not None:
        values = list(alpha_layers)
        if len(values) != num_layers:
            raise AlphaError(
                f"--alpha-layers has {len(values)} values but the model has {num_layers} "
                f"layers; give one α per layer (1 = softmax), e.g. "
                f"{','.join(['1.5'] * num_layers)}"
            )
        alphas = []
        for index, value in enumerate(values):
            try:
                alphas.append(validate_alpha(value))
            except ValueError as error:
                raise AlphaError(f"--alpha-layers, layer {index}: {error}") from None
        recipe, source = "per-layer", "--alpha-layers"
    else:
        recipe = config_recipe(config)
        if alpha is not None:
            value, source = validate_alpha(alpha), "--alpha"
        elif (own := config_alpha(config)) is not None:
            value, source = own[0], f"config {own[1]}"
        else:
            value, source = DEFAULT_ALPHA, "default"
        alphas = [1.0 if recipe == "global-only" and index in local else value
                  for index in range(num_layers)]
    plans = [LayerPlan(index, a, index in local, local.get(index))
             for index, a in enumerate(alphas)]
    return plans, recipe, source


def summary_alpha(plans: Sequence[LayerPlan]) -> float:
    """One α for the whole model (file metadata, checks): the entmax layers' largest, or 1
    when every layer is softmax."""
    entmax = [plan.alpha for plan in plans if not plan.softmax]
    return max(entmax) if entmax else 1.0


def uniform(plans: Sequence[LayerPlan]) -> bool:
    """Whether every layer has the same α."""
    return len({plan.alpha for plan in plans}) <= 1 and all(math.isfinite(p.alpha)
                                                           for p in plans)
