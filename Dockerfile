# One image for every stepwatch service (agent, simulator, stream workers, sink, remediator),
# plus a `remediator` target with the Slurm client. Not built in CI (no Docker engine
# there); tests/unit/deploy/test_compose.py checks that what this file copies exists and the
# extras it installs are defined. See docker-compose.yml.
FROM python:3.11-slim-bookworm AS base
WORKDIR /app
COPY pyproject.toml setup.py README.md ./
COPY stepwatch ./stepwatch
COPY agents ./agents
COPY streams ./streams
COPY exporters ./exporters
COPY alerts ./alerts
# the compose healthchecks and the Kubernetes readiness probe (deploy/healthcheck.py)
COPY deploy/healthcheck.py /usr/local/bin/stepwatch-healthcheck
# remediate: the remediator (policy YAML, Kubernetes actuator, audit topic)
RUN pip install --no-cache-dir '.[agent,stream,store,remediate,report]' \
    && chmod 0755 /usr/local/bin/stepwatch-healthcheck
ENTRYPOINT ["stepwatch"]
CMD ["--help"]

# The remediator with the Slurm client tools its slurm actuator runs (scontrol, sinfo;
# munge authenticates them). Mount the cluster's /etc/slurm/slurm.conf and
# /etc/munge/munge.key, and run munged (docs/deploy.md, "The remediator").
FROM base AS remediator
RUN apt-get update \
    && apt-get install -y --no-install-recommends slurm-client munge \
    && rm -rf /var/lib/apt/lists/*
