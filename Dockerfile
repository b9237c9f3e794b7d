# The gpumeter service and agent in one image: `gpumeter ...` and `gpumeter-agent ...`.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY app ./app
COPY metering_agent ./metering_agent
COPY migrations ./migrations
RUN pip install . && useradd --system --create-home gpumeter \
    && mkdir -p /var/lib/gpumeter-agent && chown gpumeter /var/lib/gpumeter-agent

USER gpumeter
WORKDIR /home/gpumeter
EXPOSE 8000
# `gpumeter serve` applies the migrations before it serves.
CMD ["gpumeter", "serve", "--host", "0.0.0.0", "--port", "8000"]
