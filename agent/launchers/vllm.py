"""vLLM launcher: ``vllm serve MODEL ...`` for the pinned release (0.33).

Only flags that exist in that release are passed: ``--disable-log-requests`` and ``--swap-space`` were
removed upstream and make ``vllm serve`` exit with "unrecognized arguments". ``--shutdown-timeout`` (vLLM
>= 0.18) is ``drain.graceSeconds - drain.propagationSeconds - 5``: the engine finishes in-flight requests
for that long after SIGTERM and rejects new ones, while ``/health`` stays 200 (readiness is the agent's).

Example pool (``engine.kind: vllm``)::

    engine: {kind: vllm, version: "0.33.0", maxNumSeqs: 256, maxNumBatchedTokens: 2048}
    drain: {graceSeconds: 120, propagationSeconds: 10}     # -> --shutdown-timeout 105

MODEL is the local directory the agent fetched from the model store, else the pool's model id; loading from the
Hub, a ``modelRevision`` other than ``main`` is passed as ``--revision``.

On a host without a GPU (``LaunchConfig.device`` ``cpu``) vLLM runs on the CPU, where two of the spec's flags break
it (vLLM 0.32, the CPU build), so `dropped_flags` leaves them out:

* ``--gpu-memory-utilization``: vLLM on CPU reserves that share of the host's memory for itself, sizing its KV cache
  from it (0.9 claims most of the machine, and a second replica on the host fails its start check,
  ``vllm/v1/worker/cpu_worker.py``). The KV cache gets ``engine.cpuKvCacheGib`` GiB instead, as
  ``VLLM_CPU_KVCACHE_SPACE`` in its environment (which also skips that check), unless the agent's own environment
  sets that variable.
* ``--enable-sleep-mode``: vLLM on CPU refuses to start with it ("Sleep mode is not supported on current
  platform"). ``VLLM_SERVER_DEV_MODE=1`` stays, so ``/sleep`` and ``/wake_up`` still answer; they free nothing.

And on CPU the engine gets ``VLLM_CPU_OMP_THREADS_BIND=nobind`` unless the agent's environment sets it: vLLM's
``auto`` binding pins every engine's worker to the host's first core (reserving the next for its scheduler,
``vllm/utils/ompmultiprocessing.py``), whatever else runs there, and an agent cannot know how many engines share its
host. With two replicas on a two-core host, a restarting engine's worker, pinned to the core its busy twin was
pinned to, took 3 min 45 s to import where the first start took under a minute (the real-engine tier's restart
window); unbound, the kernel spreads them.

A prefill or decode pool's engine also gets ``--kv-transfer-config`` (``kv_buffer_device: cpu`` on a CPU) and NIXL's
side channel, with UCX held to TCP over loopback on a CPU host whose side channel is local
(`agent.launchers.kv_transfer`).
"""

from __future__ import annotations

import shutil

from agent.launchers.base import CPU_KV_CACHE_ENV, Launcher

__all__ = ["CPU_BIND_ENV", "CPU_KV_CACHE_ENV", "VllmLauncher"]

CPU_BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"  # vLLM on CPU: auto (pin to the first cores), nobind, or a core list


class VllmLauncher(Launcher, name="vllm"):
    def argv(self) -> list[str]:
        executable = shutil.which("vllm") or "vllm"
        revision = self.pool.model_revision
        pinned = ["--revision", revision] if self.config.model_dir is None and revision != "main" else []
        return [executable, "serve", self.model, *self.common_flags(), *pinned, *self.extra_flags()]

    def dropped_flags(self) -> dict[str, str]:
        if self.config.device != "cpu":
            return {}
        gib, source = self._cpu_kv_cache()
        return self.cpu_dropped_flags("vLLM on CPU", f"{CPU_KV_CACHE_ENV}={gib} GiB instead, {source}")

    def environment(self) -> dict[str, str]:
        env = super().environment()
        if self.config.device == "cpu":
            self.with_cpu_kv_cache(env)
            env.setdefault(CPU_BIND_ENV, "nobind")  # see the module docstring
        return env

    def _cpu_kv_cache(self) -> tuple[str, str]:
        """The KV cache's GiB on CPU and where they come from: the agent's environment, else the pool spec."""
        own = super().environment().get(CPU_KV_CACHE_ENV)
        if own:
            return own, "from the agent's environment"
        return str(self.pool.engine.cpu_kv_cache_gib), "from engine.cpuKvCacheGib"
