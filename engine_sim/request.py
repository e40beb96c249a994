"""Request: one simulated generation request (`SimRequest`), its status and its finish reason.

The scheduler owns a request's progress fields (status, token ids, computed tokens, times); the request itself
only knows its inputs and the ids it generates. Generated ids depend only on the output seed and the sequence
position (`engine_sim.tokenizer.SimTokenizer.filler_ids` of the request's tokenizer), so text sent back in a
follow-up turn continues seamlessly.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from engine_sim.tokenizer import APPROX, SimTokenizer

__all__ = ["FinishReason", "RequestStatus", "SimRequest"]

_FILL_CHUNK = 64  # generated ids per `filler_ids` call


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED = "finished"


class FinishReason(enum.StrEnum):
    STOP = "stop"
    LENGTH = "length"
    ABORT = "abort"
    ERROR = "error"


@dataclass(eq=False, slots=True)
class SimRequest:
    """One generation request; ``stop_after`` models the EOS of a natural answer (None: run to max_tokens)."""

    request_id: str
    prompt_token_ids: list[int]
    max_tokens: int
    stop_after: int | None = None
    output_seed: int = 0
    tokenizer: SimTokenizer = APPROX  # whose filler words the request generates
    cache_salt: str | None = None  # its prefix-cache partition (vLLM's ``cache_salt``: block 0's extra key)
    # P/D (`engine_sim.nixl`): a prefill leg's blocks are held at a length-capped finish for a decode engine's pull;
    # a decode leg's first ``remote_tokens`` prompt tokens were pulled from the prefill engine (computed at admission).
    kv_hold: bool = False
    remote_tokens: int = 0
    # Scheduler state (times are in the scheduler's clock).
    status: RequestStatus = RequestStatus.WAITING
    token_ids: list[int] = field(default_factory=list)  # prompt + generated
    num_computed_tokens: int = 0
    num_cached_tokens: int = -1  # prefix hit at first admission (local + external); -1 until admitted
    num_external_computed_tokens: int = 0  # of those, pulled from a remote prefill (vLLM's name)
    num_preemptions: int = 0
    arrival_time: float = 0.0
    scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finish_time: float | None = None
    finish_reason: FinishReason | None = None
    # Generated ids for positions ``_fill_at..``: `filler_ids` computed a chunk at a time, not once per token.
    _fill: list[int] = field(default_factory=list, init=False, repr=False)
    _fill_at: int = field(default=0, init=False, repr=False)

    def __post_init__(self) -> None:
        if not self.token_ids:
            self.token_ids = list(self.prompt_token_ids)

    def filler_token(self, position: int) -> int:
        """The generated id at sequence ``position``: ``tokenizer.filler_ids(output_seed, position, 1)[0]``."""
        offset = position - self._fill_at
        if not 0 <= offset < len(self._fill):
            # Up to the request's last possible token: most answers are shorter than a chunk.
            count = max(1, min(_FILL_CHUNK, len(self.prompt_token_ids) + self.max_tokens - position))
            self._fill, self._fill_at, offset = self.filler_ids(position, count), position, 0
        return self._fill[offset]

    def filler_ids(self, start: int, count: int) -> list[int]:
        """The generated ids at sequence positions ``start..start+count-1``."""
        return self.tokenizer.filler_ids(self.output_seed, start, count)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - len(self.prompt_token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[len(self.prompt_token_ids) :]
