"""The field's entmax checkpoints (SparseModernBERT, sparse RoBERTa) load into the stock
transformers classes with their recipe, and their gold graphs are those of an independent
eager forward written here: q/k/v per layer by hand, ``torch.softmax`` on ModernBERT's local
layers (cut to ±local_attention/2), the ``entmax`` package's entmax15 / sparsemax elsewhere.

Both forwards run in float64, so they differ by float64 rounding only (bounded through the
layers by tests/tolerances.py), whatever the CPU's kernels; the records store float32, one
more rounding. Rotary angles are float32 in transformers whatever the model's dtype; the
by-hand rotation computes them with the same float32 operations on the same shapes, so they
are the same numbers (see :func:`rotation_in_model_dtype` for the rotation itself)."""

from __future__ import annotations

import json

import pytest
import torch
from entmax import entmax15, sparsemax
from tolerances import (
    assert_same_support,
    entmax_prob_tol,
    eps,
    score_bound,
    support_bound,
    support_size,
    tol_for,
    transformer_terms,
)

from sparsefinder.data.records import extract
from sparsefinder.models.encoders import (
    MODERNBERT_LOCAL,
    save_sparse_modernbert,
    save_sparse_roberta,
)
from sparsefinder.models.loading import ModelLoadError, load_model, set_alpha

pytestmark = pytest.mark.numerical  # re-run under other CPU kernels: make test-portable

TEXTS = [
    "Sparse attention keeps only the keys that matter: entmax gives exact zeros to the rest, "
    "so the graph of each head is small and its support can be predicted.",
    "A short one.",
]


@pytest.fixture(scope="module")
def modernbert_dir(sparse_modernbert_dir):
    return sparse_modernbert_dir


@pytest.fixture
def rotation_in_model_dtype(monkeypatch):
    """transformers' ModernBERT rotates q and k in float32 whatever the model's dtype
    (``apply_rotary_pos_emb`` casts them with ``.float()``): in a float64 comparison that one
    rounding would dominate and travel through every later layer. Here the rotation runs in
    the model's dtype: the same maths, without the cast."""
    from transformers.models.modernbert import modeling_modernbert

    def rotate(q, k, cos, sin, unsqueeze_dim=1):
        cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
        half = modeling_modernbert.rotate_half
        return q * cos + half(q) * sin, k * cos + half(k) * sin

    monkeypatch.setattr(modeling_modernbert, "apply_rotary_pos_emb", rotate)


@pytest.fixture(scope="module")
def roberta_dir(tmp_path_factory, default_tokenizer):
    return save_sparse_roberta(tmp_path_factory.mktemp("sparse_roberta"), default_tokenizer,
                               alpha=2.0)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


def _rope(x: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary embedding of (1, heads, n, d) at positions 0..n-1, written out: angles, cos and
    sin in float32 (1, n, d), as transformers computes them for any model dtype."""
    n, d = x.shape[-2:]
    inv_freq = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
    angles = torch.arange(n, dtype=torch.float32)[None, :, None] * inv_freq[None, None]
    angles = torch.cat((angles, angles), dim=-1)
    cos, sin = angles.cos().to(x.dtype)[:, None], angles.sin().to(x.dtype)[:, None]
    return x * cos + _rotate_half(x) * sin


@torch.no_grad()
def modernbert_by_hand(model, ids: torch.Tensor):
    """(final hidden states, per layer (queries, probabilities)) of one unpadded text."""
    config = model.config
    heads = config.num_attention_heads
    d = config.hidden_size // heads
    n = ids.shape[1]
    distance = (torch.arange(n)[:, None] - torch.arange(n)[None]).abs()
    h = model.embeddings(input_ids=ids)
    layers = []
    for index, layer in enumerate(model.layers):
        kind = config.layer_types[index]
        theta = config.rope_parameters[kind]["rope_theta"]
        qkv = layer.attn.Wqkv(layer.attn_norm(h)).view(1, n, 3, heads, d)
        q, k, v = (t.transpose(1, 2) for t in qkv.unbind(2))
        q, k = _rope(q, theta), _rope(k, theta)
        scores = q @ k.transpose(-1, -2) * d ** -0.5
        if kind == "sliding_attention":  # softmax within ±local_attention/2
            scores = scores.masked_fill(distance > config.local_attention // 2, float("-inf"))
            probs = torch.softmax(scores, dim=-1)
        else:
            probs = entmax15(scores, dim=-1)
        out = (probs @ v).transpose(1, 2).reshape(1, n, -1)
        h = h + layer.attn.Wo(out)
        h = h + layer.mlp(layer.mlp_norm(h))
        layers.append((q[0], probs[0]))
    return model.final_norm(h), layers


@torch.no_grad()
def roberta_by_hand(model, ids: torch.Tensor):
    config = model.config
    heads = config.num_attention_heads
    d = config.hidden_size // heads
    n = ids.shape[1]
    h = model.embeddings(input_ids=ids)
    layers = []
    for layer in model.encoder.layer:
        attention = layer.attention.self
        q, k, v = (f(h).view(1, n, heads, d).transpose(1, 2)
                   for f in (attention.query, attention.key, attention.value))
        probs = sparsemax(q @ k.transpose(-1, -2) * d ** -0.5, dim=-1)  # as the model scales
        context = (probs @ v).transpose(1, 2).reshape(1, n, -1)
        a = layer.attention.output(context, h)
        h = layer.output(layer.intermediate(a), a)
        layers.append((q[0], probs[0]))
    return h, layers


def _check_against(loaded, by_hand) -> None:
    """Every text, extracted in ONE padded batch, equals the by-hand forward edge for edge
    (except keys within float64 rounding of the threshold), both in float64."""
    loaded.model.double()
    config = loaded.model.config
    records = extract(loaded, TEXTS, batch_size=len(TEXTS))
    for text, record in zip(TEXTS, records, strict=True):
        ids = torch.tensor([loaded.tokenizer(text)["input_ids"]])
        n = ids.shape[1]
        hidden, layers = by_hand(loaded.model, ids)
        ours = loaded.model(input_ids=ids).last_hidden_state
        sizes = {"hidden": config.hidden_size, "intermediate": config.intermediate_size,
                 "n": max(n, record.n_tokens)}
        terms = transformer_terms(layers=len(layers), **sizes)
        torch.testing.assert_close(ours, hidden, **tol_for(hidden, terms=terms))
        assert record.num_layers == len(layers)
        for index, (graph, (queries, probs)) in enumerate(zip(record.layers, layers,
                                                              strict=True)):
            # the layers before and this one's projection, in float64; then stored as float32
            terms = transformer_terms(layers=index, **sizes) + config.hidden_size
            keys = graph.keys.double()
            q_err = tol_for(queries, terms=terms)["atol"]
            k_err = tol_for(keys, terms=terms)["atol"]
            stored = tol_for(queries, dtype=torch.float32)["atol"]
            torch.testing.assert_close(graph.queries.double(), queries, atol=q_err + stored,
                                       rtol=0)
            score_err = score_bound(queries, keys, graph.scaling, q_err=q_err, k_err=k_err)
            ours_probs = graph.probs().double()
            s = support_size(ours_probs, probs)
            assert_same_support(ours_probs, probs,  # edge for edge
                                slack=support_bound(score_err, graph.alpha, s, torch.float64))
            prob_err = entmax_prob_tol(score_err, graph.alpha, s, torch.float64)
            torch.testing.assert_close(ours_probs, probs, atol=prob_err + eps(torch.float32),
                                       rtol=0)


def test_sparse_modernbert_runs_entmax_on_global_layers_and_softmax_on_local(
        modernbert_dir, rotation_in_model_dtype):
    loaded = load_model(str(modernbert_dir), device="cpu")  # α from the config: 1.5
    assert loaded.alpha == 1.5 and loaded.alpha_source == "config initial_alpha"
    assert loaded.recipe == "global-only"
    assert loaded.layer_alphas == [1.5, 1.0, 1.0, 1.5]
    assert [plan.local for plan in loaded.layers] == [False, True, True, False]
    # transformers hands local layers W = local_attention/2 + 1: keys |i - j| < W
    assert loaded.sliding_window_layers == {1: MODERNBERT_LOCAL // 2 + 1,
                                           2: MODERNBERT_LOCAL // 2 + 1}
    _check_against(loaded, modernbert_by_hand)


def test_modernbert_local_gold_is_dense_inside_its_bidirectional_window(modernbert_dir):
    loaded = load_model(str(modernbert_dir), device="cpu")
    (record,) = extract(loaded, TEXTS[0])
    n = record.n_tokens
    assert n > MODERNBERT_LOCAL + 1  # the window cuts something
    distance = (torch.arange(n)[:, None] - torch.arange(n)[None]).abs()
    band = distance <= MODERNBERT_LOCAL // 2
    for index, graph in enumerate(record.layers):
        local = index in (1, 2)
        assert graph.is_softmax == local
        assert graph.sliding_window == (MODERNBERT_LOCAL // 2 + 1 if local else None)
        if local:  # softmax: every pair of the ±4 band, none outside
            assert torch.equal(graph.gold, band.expand_as(graph.gold))
        else:  # entmax: sparse, and free to reach beyond the band
            assert 0 < graph.gold.float().mean() < 1
    scores = record.layers[1].scores(causal=record.causal)
    assert torch.isinf(scores[:, ~band]).all() and torch.isfinite(scores[:, band]).all()


def test_sparse_roberta_runs_sparsemax_on_every_layer(roberta_dir):
    loaded = load_model(str(roberta_dir), device="cpu")
    assert loaded.layer_alphas == [2.0, 2.0] and loaded.recipe == "uniform"
    assert "entmax-trained" in loaded.adapter_label()
    _check_against(loaded, roberta_by_hand)


def test_user_alpha_overrides_the_config_but_keeps_the_recipe(modernbert_dir):
    loaded = load_model(str(modernbert_dir), alpha=2.0, device="cpu")
    assert loaded.layer_alphas == [2.0, 1.0, 1.0, 2.0] and loaded.alpha_source == "--alpha"
    set_alpha(loaded, 1.25)  # the app's slider: the recipe still holds
    assert loaded.layer_alphas == [1.25, 1.0, 1.0, 1.25] and loaded.alpha == 1.25
    assert loaded.model.config.entmax_alpha_layers == (1.25, 1.0, 1.0, 1.25)
    assert "entmax-trained" in loaded.adapter_label()
    every = load_model(str(modernbert_dir), alpha_layers=[1.5, 1.5, 2.0, 1.0], device="cpu")
    assert every.layer_alphas == [1.5, 1.5, 2.0, 1.0] and every.recipe == "per-layer"
    (record,) = extract(every, TEXTS[0])
    assert [graph.alpha for graph in record.layers] == [1.5, 1.5, 2.0, 1.0]
    assert [graph.is_softmax for graph in record.layers] == [False, False, False, True]
    # an entmax local layer is sparse inside its window, and never outside it
    n = record.n_tokens
    band = (torch.arange(n)[:, None] - torch.arange(n)[None]).abs() <= MODERNBERT_LOCAL // 2
    assert not record.layers[1].gold[:, ~band].any()
    assert record.layers[1].gold[:, band].float().mean() < 1


def test_alpha_layers_of_the_wrong_length_or_below_one_are_refused(modernbert_dir):
    with pytest.raises(ModelLoadError, match=r"has 3 values but the model has 4 layers"):
        load_model(str(modernbert_dir), alpha_layers=[1.5, 1.5, 1.5], device="cpu")
    with pytest.raises(ModelLoadError, match=r"layer 2: alpha must be >= 1"):
        load_model(str(modernbert_dir), alpha_layers=[1.5, 1.5, 0.5, 1.5], device="cpu")


def test_an_unknown_recipe_names_the_known_ones_and_the_override(tmp_path, default_tokenizer):
    folder = save_sparse_modernbert(tmp_path / "odd", default_tokenizer,
                                    entmax_recipe="every-other")
    with pytest.raises(ModelLoadError) as error:
        load_model(str(folder), device="cpu")
    message = str(error.value)
    assert "'every-other'" in message and "'uniform'" in message
    assert "'global-only'" in message and "--alpha-layers" in message
    loaded = load_model(str(folder), alpha_layers=[1.5, 1, 1.5, 1], device="cpu")
    assert loaded.layer_alphas == [1.5, 1.0, 1.5, 1.0]


def test_checkpoints_load_from_safetensors_only_and_never_run_their_code(roberta_dir, tmp_path):
    config = json.loads((roberta_dir / "config.json").read_text())
    assert "auto_map" in config  # names code that does not exist: it was never imported
    pickled = tmp_path / "pickled"
    pickled.mkdir()
    for item in roberta_dir.iterdir():
        if item.name != "model.safetensors":
            (pickled / item.name).write_bytes(item.read_bytes())
    from safetensors.torch import load_file
    torch.save(load_file(roberta_dir / "model.safetensors"), pickled / "pytorch_model.bin")
    with pytest.raises(ModelLoadError, match="safetensors only"):
        load_model(str(pickled), device="cpu")
