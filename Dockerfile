# CPU image: runs the main job (`make run-all`) on the simulator backend.
#   docker build --target cpu -t dlfp:cpu . && docker run --rm -v "$PWD/data:/artifact/data" dlfp:cpu
# GPU image: vLLM 0.17.1 (CUDA) with the DLFP scheduler; runs the matrix on the real engine.
#   docker build --target gpu -t dlfp:gpu . && docker run --rm --gpus all -v "$PWD/data:/artifact/data" dlfp:gpu
FROM python:3.11.7-slim-bookworm AS cpu
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1 MPLBACKEND=Agg
# Distribution security updates replace old package versions, so apt pins would break rebuilds (DL3008).
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends make git \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /artifact
COPY pyproject.toml README.md Makefile ./
COPY requirements ./requirements
COPY artifact ./artifact
RUN make venv
COPY . .
CMD ["make", "run-all", "BACKEND=sim"]

# GPU stage: vLLM 0.17.1 and the torch it pins, on CUDA.
FROM nvidia/cuda:12.8.1-cudnn-runtime-ubuntu22.04 AS gpu
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1 MPLBACKEND=Agg DEBIAN_FRONTEND=noninteractive
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends software-properties-common make git \
    && add-apt-repository -y ppa:deadsnakes/ppa \
    && apt-get install -y --no-install-recommends python3.11 python3.11-venv python3.11-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /artifact
COPY . .
RUN python3.11 -m venv .venv \
    && .venv/bin/pip install "pip==26.3" \
    && .venv/bin/pip install -e ".[vllm]"
CMD ["make", "run-all", "BACKEND=vllm", "PYTHON=python3.11"]
