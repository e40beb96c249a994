"""Compare: the real engine's answer and the simulator's, field by field, into a list of differences.

Everything is compared exactly (status, media type, keys present, values, list lengths, the order of streamed
events) except values that cannot match between random weights and the simulator's filler: generated text,
ids, timestamps and floats (log-probabilities, timings). Those are compared by kind only (string, number, null,
...), and only where they are leaves: the structure holding them is always compared.

A stream is compared as its runs: consecutive events of the same name and shape (the content chunks of a
stream) count as one, so a different number of generated chunks is not a difference but a chunk of another shape,
a missing usage chunk or a missing ``[DONE]`` is.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from tests.differential.exchange import Exchange

__all__ = ["VARYING", "Difference", "compare", "compare_values", "kind"]

# Leaves whose value depends on the weights, the clock or a random id: compared by kind.
VARYING = frozenset({
    "id", "created", "created_at", "completed_at", "text", "content", "delta", "token", "bytes", "token_ids",
    "output_text", "response_id", "item_id", "system_fingerprint", "arguments", "refusal", "logprob",
    "sequence_number",
})  # fmt: skip
# Paths whose leaves depend on the generated text although their key does not say so: completions' log-probability
# lists (the tokens and their offsets in the text). /tokenize's "tokens" are the prompt's and compared exactly.
_VARYING_PATH = re.compile(r"\.logprobs\.(tokens|text_offset)\[\d+\]$")
# Maps keyed by generated text (completions' top_logprobs: {token: logprob}): compared by their number of entries.
KEYED_BY_TEXT = frozenset({"top_logprobs"})


@dataclass(frozen=True)
class Difference:
    probe: str
    path: str  # where in the answer: "status", "body.choices[0].logprobs", "events[3].data.usage", ...
    what: str  # "status", "value", "kind", "length", "missing in the simulator", "only in the simulator"
    real: Any = None
    sim: Any = None

    @property
    def key(self) -> str:
        """Stable across runs: probe, path and what differs (never the values, which may vary)."""
        return f"{self.probe} | {self.path} | {self.what}"


def kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "list"
    return "object"


def compare_values(probe: str, path: str, real: Any, sim: Any, key: str = "") -> Iterator[Difference]:
    """The differences between two JSON values; ``key`` is the name the value sits under (for `VARYING`)."""
    if kind(real) != kind(sim):
        yield Difference(probe, path, "kind", kind(real), kind(sim))
    elif isinstance(real, dict) and key in KEYED_BY_TEXT:
        if len(real) != len(sim):
            yield Difference(probe, path, "length", len(real), len(sim))
    elif isinstance(real, dict):
        for name in real:
            sub = f"{path}.{name}" if path else name
            if name not in sim:
                yield Difference(probe, sub, "missing in the simulator", _short(real[name]))
            else:
                yield from compare_values(probe, sub, real[name], sim[name], name)
        for name in sim:
            if name not in real:
                sub = f"{path}.{name}" if path else name
                yield Difference(probe, sub, "only in the simulator", None, _short(sim[name]))
    elif isinstance(real, list):
        if len(real) != len(sim) and key not in VARYING:
            yield Difference(probe, path, "length", len(real), len(sim))
        for i, (a, b) in enumerate(zip(real, sim, strict=False)):
            yield from compare_values(probe, f"{path}[{i}]", a, b, key)
    elif key in VARYING or isinstance(real, float) or isinstance(sim, float) or _VARYING_PATH.search(path):
        return
    elif real != sim:
        yield Difference(probe, path, "value", real, sim)


def _shape(value: Any) -> Any:
    if isinstance(value, dict):
        return tuple((k, _shape(v)) for k, v in value.items())
    if isinstance(value, list):
        return ("list", tuple(_shape(v) for v in value[:1]))
    return kind(value)


def _runs(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Consecutive events of one name and shape collapsed to the first of them."""
    runs: list[dict[str, Any]] = []
    last: Any = object()
    for event in events:
        signature = (event["event"], _shape(event["data"]))
        if signature != last:
            runs.append(event)
            last = signature
    return runs


def compare(real: Exchange, sim: Exchange) -> list[Difference]:
    """Every difference between two answers to the same probe."""
    probe = real.probe
    out: list[Difference] = []
    if real.status != sim.status:
        out.append(Difference(probe, "status", "status", real.status, sim.status))
    if real.media_type != sim.media_type:
        out.append(Difference(probe, "media type", "value", real.media_type, sim.media_type))
    if real.kind != sim.kind:
        out.append(Difference(probe, "body", "kind", real.kind, sim.kind))
    elif real.kind == "sse":
        a, b = _runs(real.body), _runs(sim.body)
        names = [e["event"] or "data" for e in a], [e["event"] or "data" for e in b]
        if len(a) != len(b):
            out.append(Difference(probe, "events", "length", names[0], names[1]))
        for i, (x, y) in enumerate(zip(a, b, strict=False)):
            if x["event"] != y["event"]:
                out.append(Difference(probe, f"events[{i}].event", "value", x["event"], y["event"]))
            out.extend(compare_values(probe, f"events[{i}].data", x["data"], y["data"]))
    elif real.kind in ("json", "text", "error"):
        out.extend(compare_values(probe, "body", real.body, sim.body))
    return out


def _short(value: Any) -> Any:
    """A value small enough for a report line."""
    text = repr(value)
    return value if len(text) <= 80 else text[:77] + "..."
