"""After the Dockerfile's install step (run2.sh): the installed package alone finds its bundled
files, loads the default model on CUDA and extracts a gold graph."""

from __future__ import annotations

import os
import time

import sparsefinder
from sparsefinder.bundle import bundle
from sparsefinder.data.records import extract
from sparsefinder.models.loading import load_model


def main() -> None:
    print("sparsefinder from", sparsefinder.__file__)
    assert "/tmp/pkg/" in sparsefinder.__file__, "not the installed package"
    files = bundle()
    projections = files.path("projections.pt")
    print("bundle files:", len(files.files()), "projections:", os.path.getsize(projections))
    start = time.perf_counter()
    loaded = load_model("default")
    print("default model on", loaded.device, f"in {time.perf_counter() - start:.1f}s")
    assert loaded.device.type == "cuda", "the default model did not pick the GPU"
    record = extract(loaded, "The cat sat on the mat because it was tired, and then it slept.")[0]
    print("record layers", len(record.layers), "gold density of layer 0",
          float(record.layers[0].gold.float().mean()))
    print("DOCKER_CHECK_OK")


if __name__ == "__main__":
    main()
