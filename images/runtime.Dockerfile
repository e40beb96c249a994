# The runtime image: gateway, control plane, and agent with the engine simulator (`llmfleet <command>`).
#
# BASE provides python3 (3.11 or later) with its venv module. The default is the public slim image;
# `images/build.sh` passes a Debian bookworm made with debootstrap instead (same Python, no registry needed).
# The runtime install leaves out the `infra` extra: no Pulumi in the image.
ARG BASE=docker.io/library/python:3.11-slim-bookworm

FROM ${BASE} AS build
# pip trusts this CA bundle when the build mounts one (`images/build.sh` mounts the host's).
ARG PIP_CERT
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PIP_ROOT_USER_ACTION=ignore
WORKDIR /src
# Dependencies first, from pyproject alone: a source change reuses this layer.
COPY pyproject.toml ./
RUN python3 -m venv /opt/llmfleet \
 && python3 -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" \
      > /tmp/requirements.txt \
 && /opt/llmfleet/bin/pip install -r /tmp/requirements.txt "setuptools>=69" wheel
COPY README.md ./
COPY fleet/ fleet/
COPY engine_sim/ engine_sim/
COPY agent/ agent/
COPY gateway/ gateway/
COPY control_plane/ control_plane/
COPY infra/ infra/
COPY policies/ policies/
COPY rollout/ rollout/
COPY simulate/ simulate/
COPY llmfleet/ llmfleet/
# The package on top of its dependencies; then the installers go, so nothing in the image can build code.
RUN /opt/llmfleet/bin/pip install --no-deps --no-build-isolation . \
 && /opt/llmfleet/bin/pip uninstall --yes setuptools wheel pip

FROM ${BASE}
# A fixed numeric uid/gid: Kubernetes' runAsNonRoot can only verify a numeric USER. The pip and setuptools wheels
# Debian's python3-venv ships go too, so `python3 -m venv` or ensurepip cannot bring an installer back.
RUN groupadd --gid 10001 llmfleet \
 && useradd --uid 10001 --gid 10001 --no-log-init --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin llmfleet \
 && rm -rf /usr/share/python-wheels
COPY --from=build /opt/llmfleet /opt/llmfleet
ENV PATH=/opt/llmfleet/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
LABEL org.opencontainers.image.title="llmfleet" \
      org.opencontainers.image.description="llmfleet gateway, control plane, and agent with the engine simulator" \
      org.opencontainers.image.licenses="Apache-2.0"
USER 10001:10001
WORKDIR /tmp
ENTRYPOINT ["llmfleet"]
CMD ["--help"]
