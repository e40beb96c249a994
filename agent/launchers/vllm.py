"""vLLM launcher: ``vllm serve MODEL ...`` for the pinned release (0.33).

Only flags that exist in that release are passed: ``--disable-log-requests`` and ``--swap-space`` were
removed upstream and make ``vllm serve`` exit with "unrecognized arguments". ``--shutdown-timeout`` (vLLM
>= 0.18) is ``drain.graceSeconds - drain.propagationSeconds - 5``: the engine finishes in-flight requests
for that long after SIGTERM and rejects new ones, while ``/health`` stays 200 (readiness is the agent's).

Example pool (``engine.kind: vllm``)::

    engine: {kind: vllm, version: "0.33.0", maxNumSeqs: 256, maxNumBatchedTokens: 2048}
    drain: {graceSeconds: 120, propagationSeconds: 10}     # -> --shutdown-timeout 105
"""

from __future__ import annotations

import shutil

from agent.launchers.base import Launcher

__all__ = ["VllmLauncher"]


class VllmLauncher(Launcher, name="vllm"):
    def argv(self) -> list[str]:
        executable = shutil.which("vllm") or "vllm"
        return [executable, "serve", self.pool.model, *self.common_flags(), *self.extra_flags()]
