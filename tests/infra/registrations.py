"""Registrations: a stack's offline run that also keeps each resource's options and answers chosen invokes.

`infra.offline.RecordedResource` keeps props and dependencies; the options a ``pulumi up`` acts on before any
provider is asked (``protect``, ``ignoreChanges``) are in the registration request too, so this wrapper keeps
them, by URN. ``invokes`` answers data-source calls (token -> function of the call's args -> outputs), as a live
account would, so the program's reads of existing state can be exercised.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest

from infra import offline
from infra.offline import OfflineRun
from infra.stack_run import offline_run
from tests.support.stacks import stack_document

Invoke = Callable[[Mapping[str, Any]], dict[str, Any]]


@dataclass(frozen=True)
class Options:
    protect: bool
    ignore_changes: tuple[str, ...]


@dataclass
class Registrations:
    run: OfflineRun
    options: dict[str, Options] = field(default_factory=dict)  # URN -> options

    def of(self, type_token: str) -> list[tuple[offline.RecordedResource, Options]]:
        return [(r, self.options[r.urn]) for r in self.run.of_type(type_token)]


@contextmanager
def _recording(monkeypatch: pytest.MonkeyPatch, invokes: Mapping[str, Invoke]) -> Iterator[dict[str, Options]]:
    options: dict[str, Options] = {}
    register = offline._RecordingMonitor.RegisterResource
    call = offline.RecordingMocks.call

    def recording_register(self: Any, request: Any) -> Any:
        response = register(self, request)
        options[response.urn] = Options(bool(request.protect), tuple(request.ignoreChanges))
        return response

    def answering_call(self: Any, args: Any) -> Any:
        if args.token in invokes:
            return invokes[args.token](dict(args.args)), []
        return call(self, args)

    with monkeypatch.context() as patch:
        patch.setattr(offline._RecordingMonitor, "RegisterResource", recording_register)
        patch.setattr(offline.RecordingMocks, "call", answering_call)
        yield options


def registrations(
    monkeypatch: pytest.MonkeyPatch,
    stack: str = "prod",
    invokes: Mapping[str, Invoke] | None = None,
    **overrides: Any,
) -> Registrations:
    """Run ``stack`` (with `tests.support.stacks` ``overrides``) under mocks, keeping every registration's
    options."""
    document = stack_document(stack, **overrides)
    with _recording(monkeypatch, invokes or {}) as options:
        run = offline_run(document, stack)
    return Registrations(run, dict(options))
