# syntax=docker/dockerfile:1
# Edge LLM Engine: `edge-llm serve` in a slim image, as a non-root user, the model on a volume.
#
#   docker build -t edge-llm .
#   docker run --rm -v edge-llm-models:/models edge-llm edge-llm model fetch      # once: the default model
#   docker run -d --name edge-llm -p 3000:3000 -v edge-llm-models:/models --stop-timeout 40 edge-llm
#
# Another model: mount its folder and set EDGE_LLM_MODEL, e.g. -v /srv/gguf:/models:ro -e EDGE_LLM_MODEL=/models/m.gguf.
# Every `serve` flag is an EDGE_LLM_* variable too (docs/configuration.md). docs/deployment.md has the rest.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# ---- build: llama-cpp-python compiled once, everything installed into /opt/venv -------------------
FROM ${PYTHON_IMAGE} AS build
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends build-essential cmake \
    && rm -rf /var/lib/apt/lists/*
# llama.cpp for any x86-64 CPU with AVX2 (not just the build machine's: GGML_NATIVE=OFF). Older CPUs:
# --build-arg LLAMA_CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=OFF -DGGML_FMA=OFF -DGGML_F16C=OFF -DGGML_BMI2=OFF".
ARG LLAMA_CMAKE_ARGS="-DGGML_NATIVE=OFF"
ENV CMAKE_ARGS=${LLAMA_CMAKE_ARGS} \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
WORKDIR /src
# The dependencies first, in their own layer: the llama-cpp-python build (minutes) is redone only when
# pyproject.toml changes, not for every change of the code.
COPY pyproject.toml README.md ./
RUN mkdir -p src/edge_llm && touch src/edge_llm/__init__.py \
    && /opt/venv/bin/pip install --no-cache-dir . \
    && /opt/venv/bin/pip uninstall -y edge-llm
COPY src ./src
RUN /opt/venv/bin/pip install --no-cache-dir --no-deps .

# ---- runtime: the venv, the OpenMP runtime llama.cpp links to, no compilers ------------------------
FROM ${PYTHON_IMAGE}
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends libgomp1 \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --user-group --create-home --home-dir /home/edge edge \
    && mkdir /models && chown edge:edge /models
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    EDGE_LLM_MODELS_DIR=/models \
    EDGE_LLM_HOST=0.0.0.0 \
    EDGE_LLM_PORT=3000
USER 10001:10001
WORKDIR /home/edge
VOLUME ["/models"]
EXPOSE 3000
# Ready = the model is loaded and work is accepted (503 while loading, draining or with a full queue).
HEALTHCHECK --interval=10s --timeout=5s --start-period=120s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request as u; u.build_opener(u.ProxyHandler({})).open('http://127.0.0.1:%s/readyz' % os.environ.get('EDGE_LLM_PORT', '3000'), timeout=4)"]
# The server itself is PID 1 and handles SIGTERM: /readyz turns 503 `draining`, requests in flight get
# up to --drain-timeout (30 s) to finish, then it exits 0. Give `docker stop` longer than that (-t 40).
STOPSIGNAL SIGTERM
CMD ["edge-llm", "serve"]
