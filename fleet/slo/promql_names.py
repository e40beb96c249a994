"""PromQL names: the metric names and label values a PromQL expression selects, without a PromQL parser.

Used to check that every rule and dashboard query reads series some component exports (`missing_series`).
Enough of PromQL is understood to be exact on what the project writes: string literals, label matchers
(``{...}``), range and subquery brackets (``[5m]``, ``[1h:1m]``), grouping lists (``by (le)``, ``on (pool)``,
``group_left (x)``), numbers (``1e-3``, ``0x1f``) and modifiers (``offset 5m``, ``@ 1609746000``) are taken out
first; then every identifier left that is not followed by ``(`` (a function or an aggregation) and is not a
keyword is a metric name. ``{__name__="x"}`` selectors count as ``x``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from fleet.protocol import promtext

__all__ = ["exposed_names", "label_values", "metric_names", "missing_series"]

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_BRACES = re.compile(r"\{[^{}]*\}")
_BRACKETS = re.compile(r"\[[^\[\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)", re.IGNORECASE)
_NUMBER = re.compile(r"(?<![\w:.])(?:0x[0-9a-fA-F]+|\d+(?:\.\d*)?(?:e[+-]?\d+)?|\.\d+(?:e[+-]?\d+)?)", re.IGNORECASE)
_MODIFIER = re.compile(r"\b(?:offset\s+-?[0-9a-z]+|@\s*[0-9.]+)", re.IGNORECASE)  # offset 5m, @ 1609746000
_IDENT = re.compile(r"(?<![\w:.])([a-zA-Z_:][a-zA-Z0-9_:]*)(?![a-zA-Z0-9_:]|\s*\()")
_MATCHER = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!=|!~|=)\s*("(?:[^"\\]|\\.)*")')
_TYPE = re.compile(r"^#\s*TYPE\s+(\S+)\s+(\S+)", re.MULTILINE)
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)", re.MULTILINE)
# The series a family of each type exposes, as prometheus_client names them.
_SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "summary": ("", "_count", "_sum", "_created"),
    "gaugehistogram": ("_bucket", "_gcount", "_gsum"),
}
_KEYWORDS = frozenset(
    {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring", "group_left", "group_right"}
    | {"inf", "nan", "atan2", "start", "end"}
)


def _label_sets(expr: str) -> list[str]:
    """The inside of every ``{...}`` label matcher list (strings kept: they may hold braces)."""
    out: list[str] = []
    depth, start, quote = 0, 0, ""
    i = 0
    while i < len(expr):
        ch = expr[i]
        if quote:
            if ch == "\\":
                i += 1
            elif ch == quote:
                quote = ""
        elif ch in "\"'`":
            quote = ch
        elif ch == "{":
            depth, start = depth + 1, i + 1
        elif ch == "}" and depth:
            depth -= 1
            out.append(expr[start:i])
        i += 1
    return out


def _unquote(literal: str) -> str:
    return literal[1:-1].replace('\\"', '"').replace("\\\\", "\\")


def metric_names(expr: str) -> set[str]:
    """Every metric (or recording rule) name ``expr`` selects, e.g. ``{"vllm:num_requests_running"}``."""
    named = {
        _unquote(value)
        for labels in _label_sets(expr)
        for label, op, value in _MATCHER.findall(labels)
        if label == "__name__" and op == "="
    }
    text = _STRING.sub('""', expr)
    text = _BRACES.sub(" ", text)
    while _BRACKETS.search(text):  # nested subqueries: innermost first
        text = _BRACKETS.sub(" ", text)
    text = _GROUPING.sub(" ", text)
    text = _MODIFIER.sub(" ", text)
    text = _NUMBER.sub(" ", text)
    idents = {name for name in _IDENT.findall(text) if name.lower() not in _KEYWORDS}
    return idents | named


def label_values(expr: str, label: str) -> set[str]:
    """The values ``expr``'s equality matchers give ``label`` (``le="0.3"`` -> ``{"0.3"}``)."""
    return {
        _unquote(value)
        for labels in _label_sets(expr)
        for name, op, value in _MATCHER.findall(labels)
        if name == label and op == "="
    }


def exposed_names(exposition: str) -> set[str]:
    """Every series name a ``/metrics`` text can carry: its samples' names, and those its ``# TYPE`` lines
    promise (a labelled family exposes no sample until a child exists): ``x_bucket``/``_count``/``_sum`` of a
    histogram, ``x_total`` of a counter."""
    names = set(_SAMPLE.findall(exposition))
    for family, kind in _TYPE.findall(exposition):
        base = family.removesuffix("_total") if kind == "counter" else family
        names |= {base + suffix for suffix in _SUFFIXES.get(kind, ("",))}
    return names


def missing_series(exprs: Iterable[str], expositions: Sequence[str], recorded: Iterable[str] = ()) -> list[str]:
    """What ``exprs`` read that none of ``expositions`` (``/metrics`` texts) exports, one line each: a series
    name (``recorded`` rule names aside), or a histogram bucket ``le`` edge that no exposition has."""
    exported = set().union(*(exposed_names(text) for text in expositions))
    edges = {
        (sample.name, sample.labels["le"])
        for text in expositions
        for samples in promtext.parse(text).values()
        for sample in samples
        if "le" in sample.labels
    }
    skip = set(recorded)
    out: list[str] = []
    for expr in exprs:
        names = metric_names(expr) - skip
        out += sorted(f"{name} in {expr!r}" for name in names - exported)
        out += sorted(
            f"{name}{{le={le!r}}} in {expr!r}"
            for name in names & exported
            if name.endswith("_bucket")
            for le in label_values(expr, "le")
            if (name, le) not in edges
        )
    return out
