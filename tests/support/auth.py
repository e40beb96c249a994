"""Auth: the environment of a process holding no control credential, and what its refusal to start must say."""

from __future__ import annotations

from fleet.protocol.control_auth import CONTROL_TOKEN_ENV, CONTROL_TOKEN_FILE_ENV

__all__ = ["NO_CREDENTIAL_ENV", "assert_names_the_ways_out"]

# Added to the test process's environment: empty counts as unset, so none of these can lend the child a credential.
NO_CREDENTIAL_ENV = {CONTROL_TOKEN_ENV: "", CONTROL_TOKEN_FILE_ENV: "", "KUBERNETES_SERVICE_HOST": ""}


def assert_names_the_ways_out(text: str) -> None:
    """``text`` (a process's output) names the secret's variable and every ``--auth`` that would let it start."""
    for needed in (f"${CONTROL_TOKEN_ENV}", "--auth shared-secret", "--auth kubernetes", "--auth none"):
        assert needed in text, f"{needed!r} not in:\n{text}"
