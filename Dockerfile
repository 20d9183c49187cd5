# syntax=docker/dockerfile:1
# kvwatch container image.
#
#   docker build -t kvwatch:0.1.0 .
#   docker run -v ./kvwatch.yaml:/etc/kvwatch/kvwatch.yaml:ro -v kvwatch-data:/var/lib/kvwatch \
#     -p 9464:9464 kvwatch:0.1.0
#
# The configuration must listen on 0.0.0.0:9464 (not the default 127.0.0.1) to be reachable
# from outside the container. tests/deploy/test_dockerfile.py replays the two pip steps below
# in a fresh virtual environment, so keep each install step a single RUN line.

# ---- builder: turn the source tree into one wheel (migrations included) ----
FROM python:3.11-slim AS builder
WORKDIR /src
# Only what the wheel is built from, so unrelated edits keep the layer cache.
COPY pyproject.toml README.md ./
COPY kvwatch ./kvwatch
COPY migrations ./migrations
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

# ---- runtime: the wheel in a venv, no build tools, no source tree ----
FROM python:3.11-slim
ARG KVWATCH_EXTRAS=postgres,tiktoken,hf
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PATH=/opt/kvwatch/bin:$PATH \
    KVWATCH_CONFIG=/etc/kvwatch/kvwatch.yaml

# A fixed UID/GID so volume ownership and Kubernetes' runAsUser/fsGroup can name it.
RUN groupadd --system --gid 10001 kvwatch \
 && useradd --system --uid 10001 --gid 10001 --no-create-home \
      --home-dir /var/lib/kvwatch --shell /usr/sbin/nologin kvwatch \
 && install -d -o 10001 -g 10001 -m 0750 /var/lib/kvwatch \
 && install -d -m 0755 /etc/kvwatch

COPY --from=builder /wheels /wheels
RUN python -m venv /opt/kvwatch && /opt/kvwatch/bin/pip install --no-cache-dir "$(ls /wheels/kvwatch-*.whl)[${KVWATCH_EXTRAS}]" && rm -rf /wheels

USER 10001:10001
WORKDIR /var/lib/kvwatch
# SQLite (the default database) lives here; mount a volume to keep results across restarts.
VOLUME ["/var/lib/kvwatch"]
EXPOSE 9464

# kvwatch's own client, stdlib only: GET /healthz on the configured listen address.
HEALTHCHECK --interval=30s --timeout=10s --start-period=60s --retries=3 \
  CMD ["kvwatch", "healthcheck"]

# Exec form: kvwatch is PID 1 and receives SIGTERM itself, then gives in-flight probes
# --grace seconds (default 30) before storing them as interrupted.
ENTRYPOINT ["kvwatch"]
CMD ["run", "--config", "/etc/kvwatch/kvwatch.yaml"]
