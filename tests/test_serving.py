"""The serving policy: exposure from the bound address, allowlist, caps, memory estimates."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from sparsefinder import serving
from sparsefinder.serving import InputRefused, ServingPolicy


@pytest.mark.parametrize(
    ("address", "loopback"),
    [("127.0.0.1", True), ("127.0.0.2", True), ("localhost", True), ("::1", True),
     ("[::1]", True), ("0.0.0.0", False), ("::", False), ("", False), (None, False),
     ("192.168.1.20", False), ("gpu-box.example.org", False)],
)
def test_loopback_addresses(address, loopback):
    assert serving.is_loopback(address) is loopback
    assert ServingPolicy.from_env(address, {}).exposed is (not loopback)


def test_from_env_reads_allowlist_and_caps(tmp_path):
    env = {
        serving.ENV_ALLOWLIST: f" bert-base-uncased , {tmp_path}/model/ ,,",
        serving.ENV_MAX_TEXT_CHARS: "5000",
        serving.ENV_MAX_PROJECTIONS_MB: "2",
    }
    policy = ServingPolicy.from_env("0.0.0.0", env)
    assert policy.allowlist == ("bert-base-uncased", str(tmp_path / "model"))
    assert policy.max_text_chars == 5000 and policy.max_projections_bytes == 2 * 1024 * 1024
    defaults = ServingPolicy.from_env("127.0.0.1", {})
    assert defaults.allowlist == () and not defaults.exposed
    assert defaults.max_text_chars == serving.DEFAULT_MAX_TEXT_CHARS
    for bad in ("0", "-3", "lots"):
        with pytest.raises(InputRefused, match=serving.ENV_MAX_TEXT_CHARS):
            ServingPolicy.from_env("127.0.0.1", {serving.ENV_MAX_TEXT_CHARS: bad})


def test_text_cap_is_far_above_the_token_limit_and_says_so():
    policy = ServingPolicy()
    assert policy.max_text_chars >= 100 * 512  # the default model reads 512 tokens
    at_cap = "a" * policy.max_text_chars
    assert policy.check_text(at_cap) is at_cap
    with pytest.raises(InputRefused) as error:
        policy.check_text(at_cap + "b")
    message = str(error.value)
    assert "too long" in message and f"{policy.max_text_chars + 1:,}" in message
    assert "shorter" in message
    policy.check_text_bytes(4 * policy.max_text_chars)
    with pytest.raises(InputRefused, match="notes.txt is too large"):
        policy.check_text_bytes(4 * policy.max_text_chars + 1, "notes.txt")


def test_localhost_loads_anything_exposed_only_the_allowlist(tmp_path):
    folder = tmp_path / "my-model"
    folder.mkdir()
    local = ServingPolicy.from_env("127.0.0.1", {})
    for name in ("default", "org/any-model", str(folder), "/etc"):
        assert local.check_model_name(name) == name
    exposed = ServingPolicy.from_env(
        "0.0.0.0", {serving.ENV_ALLOWLIST: f"org/allowed,{folder}"})
    assert exposed.check_model_name(" default ") == "default"  # always allowed
    assert exposed.check_model_name("org/allowed") == "org/allowed"
    assert exposed.check_model_name(f"{folder}/") == f"{folder}/"  # same folder, other spelling
    messages = []
    for name in ("org/other", str(tmp_path), str(tmp_path / "missing"), "/etc"):
        with pytest.raises(InputRefused) as error:
            exposed.check_model_name(name)
        messages.append(str(error.value).replace(repr(name), "NAME"))
        assert serving.ENV_ALLOWLIST in str(error.value) and "'org/allowed'" in str(error.value)
    assert len(set(messages)) == 1  # an existing and a missing folder get the same answer


def test_projections_size_cap(tmp_path):
    small = ServingPolicy(max_projections_bytes=10)
    assert small.check_projections_size(b"0123456789") == 10
    big = tmp_path / "big.pt"
    big.write_bytes(b"x" * 11)
    with pytest.raises(InputRefused, match="big.pt is too large for a projections file"):
        small.check_projections_size(big)
    with pytest.raises(InputRefused, match="upload.pt is too large"):
        small.check_projections_size(b"x" * 11, "upload.pt")


def test_available_memory_is_bounded_by_meminfo_and_cgroup(tmp_path):
    free = serving.available_memory_bytes()
    assert free is not None and free > 0
    meminfo = Path("/proc/meminfo").read_text().splitlines()
    total = next(int(line.split()[1]) * 1024 for line in meminfo if line.startswith("MemTotal:"))
    assert free <= total
    (tmp_path / "memory.max").write_text("1000000\n")
    (tmp_path / "memory.current").write_text("400000\n")
    assert serving._cgroup_headroom(tmp_path) == 600_000
    (tmp_path / "memory.max").write_text("max\n")
    assert serving._cgroup_headroom(tmp_path) is None
    assert serving._cgroup_headroom(tmp_path / "none") is None


def _weight_bytes(model: torch.nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in model.state_dict().values())


def test_estimates_match_the_loaded_weights(tiny_model_dirs):
    from transformers import AutoConfig, AutoModel

    folder = tiny_model_dirs["bert"]
    config = AutoConfig.from_pretrained(folder)
    model = AutoModel.from_pretrained(folder)
    actual = _weight_bytes(model)
    assert serving.safetensors_bytes(folder, config) == actual  # headers: exact
    assert serving.config_bytes(config) == pytest.approx(actual, rel=0.02)  # + buffers
    assert serving.estimate_model_bytes(folder, config) == actual
    config.dtype = torch.float16  # transformers would load half precision: half the bytes
    assert serving.safetensors_bytes(folder, config) == pytest.approx(actual / 2, rel=0.01)


def test_estimate_without_safetensors_uses_the_config(tmp_path, tiny_model_dirs):
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(tiny_model_dirs["gpt2"])
    assert serving.safetensors_bytes(tmp_path, config) is None
    assert serving.estimate_model_bytes(tmp_path, config) == serving.config_bytes(config) > 0
    (tmp_path / "broken.safetensors").write_bytes(b"\xff" * 16)
    assert serving.safetensors_bytes(tmp_path, config) is None  # unreadable header: no guess


def test_check_fits_keeps_headroom():
    serving.check_fits("m", 100, None)  # unknown free memory: no refusal
    serving.check_fits("m", None, 10)  # unknown size: no refusal
    serving.check_fits("m", 100 * 1024 * 1024, 200 * 1024 * 1024)
    with pytest.raises(InputRefused, match="needs about 100 MB .* only 110 MB of memory"):
        serving.check_fits("m", 100 * 1024 * 1024, 110 * 1024 * 1024)
