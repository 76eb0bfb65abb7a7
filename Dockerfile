# One image for every stepwatch service (agent, simulator, stream workers, sink).
# Not built in CI (no Docker engine there); see docker-compose.yml.
FROM python:3.11-slim-bookworm
WORKDIR /app
COPY pyproject.toml README.md ./
COPY stepwatch ./stepwatch
COPY agents ./agents
COPY streams ./streams
COPY exporters ./exporters
RUN pip install --no-cache-dir '.[agent,stream,store,dev]'
ENTRYPOINT ["stepwatch"]
CMD ["--help"]
