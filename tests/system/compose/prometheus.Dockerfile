# Prometheus from Debian's package, for the compose stack under test only (tests/system/
# test_compose_stack.py): no registry is reachable there to pull prom/prometheus, which
# docker-compose.yml keeps for everyone else. Same entry point contract as the official
# image: flags in `command`, data in /prometheus, the config at /etc/prometheus/prometheus.yml.
ARG BASE=debian:bookworm-slim
FROM ${BASE} AS prometheus
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# Unpinned: whatever bookworm ships today (a pin would break when the archive moves on).
# hadolint ignore=DL3008
RUN apt-get update -qq \
 && apt-get install -y -qq --no-install-recommends prometheus \
 && rm -rf /var/lib/apt/lists/* \
 && install -d -o prometheus -g prometheus /prometheus
# The system user the package created (its uid is whatever adduser chose).
# hadolint ignore=DL3066
USER prometheus
EXPOSE 9090
ENTRYPOINT ["/usr/bin/prometheus"]
