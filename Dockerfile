# The hybridsearch image: the CLI, the Celery worker and the bundled MiniLM model, CPU only.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HF_HUB_OFFLINE=1

# The CPU wheel first, so that `pip install .` finds torch satisfied and pulls no CUDA libraries.
RUN pip install --index-url https://download.pytorch.org/whl/cpu torch

WORKDIR /src
COPY pyproject.toml README.md ./
COPY hybridsearch ./hybridsearch
COPY indexer ./indexer
COPY query_service ./query_service
COPY workers ./workers
COPY opensearch_templates ./opensearch_templates
RUN pip install . && rm -rf /src/build

RUN useradd --create-home --uid 10001 app
USER app
WORKDIR /home/app

CMD ["hybridsearch", "--help"]
