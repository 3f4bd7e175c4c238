FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
WORKDIR /app
COPY pyproject.toml README.md ./
COPY yrelay ./yrelay
RUN pip install --no-cache-dir .
RUN useradd --create-home yrelay && mkdir /data && chown yrelay /data
USER yrelay
EXPOSE 8000
# Without YRELAY_REDIS_URL this starts an embedded redis-server with its AOF in /data.
CMD ["yrelay", "serve", "--host", "0.0.0.0", "--port", "8000", "--data-dir", "/data"]
