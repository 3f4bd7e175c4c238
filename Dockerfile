# Stage 1: the browser client (web/), built with the lockfile's exact packages.
FROM node:20-slim AS web
WORKDIR /web
COPY web/package.json web/package-lock.json ./
RUN npm ci --no-audit --no-fund
COPY web ./
RUN mkdir -p /yrelay/app && node build.mjs && test -f /yrelay/app/static/demo.js

# Stage 2: the server, with the built bundle as package data.
FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
WORKDIR /app
COPY pyproject.toml README.md ./
COPY yrelay ./yrelay
COPY --from=web /yrelay/app/static ./yrelay/app/static
RUN pip install --no-cache-dir .
RUN useradd --create-home yrelay && mkdir /data && chown yrelay /data
USER yrelay
EXPOSE 8000
# Without YRELAY_REDIS_URL this starts an embedded redis-server with its AOF in /data.
# The demo editor is at http://<host>:8000/ and the client bundle at /static/yrelay-client.js.
CMD ["yrelay", "serve", "--host", "0.0.0.0", "--port", "8000", "--data-dir", "/data"]
