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
"""

from __future__ import annotations

import shutil

from agent.launchers.base import Launcher

__all__ = ["VllmLauncher"]


class VllmLauncher(Launcher, name="vllm"):
    def argv(self) -> list[str]:
        executable = shutil.which("vllm") or "vllm"
        revision = self.pool.model_revision
        pinned = ["--revision", revision] if self.config.model_dir is None and revision != "main" else []
        return [executable, "serve", self.model, *self.common_flags(), *pinned, *self.extra_flags()]
