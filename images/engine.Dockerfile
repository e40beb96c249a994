# The engine image: vLLM's published image of the pinned release plus llmfleet; pods run `llmfleet agent`,
# which starts and supervises `vllm serve` (the base image's, found on PATH).
#
# Keep BASE's version equal to the engine version the stacks pin (engine.version, default 0.33.0): the agent targets that
# release's flags and metrics. llmfleet lives in its own virtual environment, so its dependencies never
# change vLLM's.
ARG BASE=docker.io/vllm/vllm-openai:v0.33.0

FROM ${BASE} AS build
ARG PIP_CERT
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PIP_ROOT_USER_ACTION=ignore
WORKDIR /src
COPY pyproject.toml README.md ./
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
RUN python3 -m venv /opt/llmfleet \
 && /opt/llmfleet/bin/pip install . \
 && /opt/llmfleet/bin/pip uninstall --yes setuptools wheel pip

FROM ${BASE}
# vLLM, Triton and torch write compile caches under $HOME: the user gets a home of its own.
RUN groupadd --gid 10001 llmfleet \
 && useradd --uid 10001 --gid 10001 --no-log-init --create-home --home-dir /home/llmfleet \
      --shell /usr/sbin/nologin llmfleet
COPY --from=build /opt/llmfleet /opt/llmfleet
ENV PATH=/opt/llmfleet/bin:$PATH PYTHONUNBUFFERED=1 HOME=/home/llmfleet
LABEL org.opencontainers.image.title="llmfleet-engine" \
      org.opencontainers.image.description="vLLM supervised by the llmfleet agent" \
      org.opencontainers.image.licenses="Apache-2.0"
USER 10001:10001
WORKDIR /home/llmfleet
ENTRYPOINT ["llmfleet", "agent"]
CMD ["--help"]
