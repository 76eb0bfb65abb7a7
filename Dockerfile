# One image for every stepwatch service (agent, simulator, stream workers, sink, remediator).
# Not built in CI (no Docker engine there); tests/unit/test_compose.py checks that what
# this file copies exists and the extras it installs are defined. See docker-compose.yml.
FROM python:3.11-slim-bookworm
WORKDIR /app
COPY pyproject.toml README.md ./
COPY stepwatch ./stepwatch
COPY agents ./agents
COPY streams ./streams
COPY exporters ./exporters
COPY alerts ./alerts
# pyyaml: the remediator's policy file
RUN pip install --no-cache-dir '.[agent,stream,store,report]' 'pyyaml>=6,<7'
ENTRYPOINT ["stepwatch"]
CMD ["--help"]
