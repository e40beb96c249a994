"""Plugins: one generic registry for every named plugin kind, and typed parameters checked at load.

Each component owns its plugin points and their registries; the core imports none of them. A command that
loads a stack passes the registries of what it runs to `fleet.spec.validate.check_spec` (``llmfleet validate``
passes all of them), so an unknown name or a misspelled parameter fails at load with its key path.

    FILTERS: Registry[Filter] = Registry(ROUTING_FILTER)

    class Filter(abc.ABC):
        def __init_subclass__(cls, *, name: str, **kw: Any) -> None:
            super().__init_subclass__(**kw)
            FILTERS.register(name, cls)

    class FreshMetrics(Filter, name="fresh-metrics"):
        class Params(PluginParams):
            max_age_s: float = Field(default=5.0, gt=0)   # ``maxAgeS`` in a stack file
        def __init__(self, params: Params | None = None) -> None: ...

A plugin with parameters declares a nested ``Params`` (a `PluginParams`: camelCase keys, frozen, unknown keys
refused) and takes one instance of it in its constructor; one without takes nothing. A stack file spells
parameters in camelCase like every other key; the Python (snake_case) names are refused there with a pointer
to the camelCase one, so one spelling lives in stack files.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic.alias_generators import to_camel

from fleet.spec.errors import Problem
from fleet.spec.problems import format_path, validation_problems

__all__ = [
    "ACTUATOR",
    "ENGINE_KIND",
    "KINDS",
    "PARAMETRISED_KINDS",
    "ROUTING_FILTER",
    "ROUTING_PICKER",
    "ROUTING_SCORER",
    "SCALING_POLICY",
    "BadParams",
    "PluginParams",
    "Registry",
    "UnknownPlugin",
]

ROUTING_FILTER = "routing filter"
ROUTING_SCORER = "routing scorer"
ROUTING_PICKER = "routing picker"
SCALING_POLICY = "scaling policy"
ACTUATOR = "actuator"
ENGINE_KIND = "engine kind"
KINDS = (ROUTING_FILTER, ROUTING_SCORER, ROUTING_PICKER, SCALING_POLICY, ACTUATOR, ENGINE_KIND)
# Kinds a stack refers to with a ``params`` block (actuators and engine kinds are chosen by name alone).
PARAMETRISED_KINDS = (ROUTING_FILTER, ROUTING_SCORER, ROUTING_PICKER, SCALING_POLICY)

T = TypeVar("T")


class PluginParams(BaseModel):
    """Base of every plugin's parameters; with no fields of its own it is "takes no parameters"."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        validate_by_name=True,  # Python code builds them by field name ...
        validate_by_alias=True,  # ... stack files by camelCase key (`Registry.parse_params` refuses the rest)
        extra="forbid",
        frozen=True,
        use_attribute_docstrings=True,  # the generated configuration reference shows them
    )


class UnknownPlugin(ValueError):
    """A plugin name no registry of that kind knows."""


class BadParams(ValueError):
    """A parameter block that does not validate; ``problems`` has one entry per bad key, with its path."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = problems
        super().__init__("; ".join(f"{p.path}: {p.message}" + _got(p.value) for p in problems))


class Registry(Generic[T]):
    """Plugin classes of one kind by name. Registration order is irrelevant; names list sorted."""

    def __init__(self, kind: str) -> None:
        if kind not in KINDS:
            raise ValueError(f"unknown plugin kind {kind!r}; kinds: {', '.join(KINDS)}")
        self.kind = kind
        self._classes: dict[str, type[T]] = {}

    def register(self, name: str, cls: type[T]) -> None:
        """Add ``cls`` as ``name`` (sets ``cls.name``); a second class under a taken name is refused."""
        taken = self._classes.get(name)
        if taken is not None and taken.__qualname__ != cls.__qualname__:
            raise ValueError(f"{self.kind} {name!r} is already registered by {taken.__qualname__}")
        cls.name = name  # type: ignore[attr-defined]
        self._classes[name] = cls

    def unregister(self, name: str) -> None:
        self._classes.pop(name, None)

    def names(self) -> list[str]:
        return sorted(self._classes)

    def __contains__(self, name: object) -> bool:
        return name in self._classes

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._classes)

    def get(self, name: str) -> type[T]:
        """The class registered as ``name``; `UnknownPlugin` lists the registered names."""
        try:
            return self._classes[name]
        except KeyError:
            raise UnknownPlugin(f"unknown {self.kind} {name!r}; registered: {', '.join(self.names())}") from None

    def params_model(self, name: str) -> type[PluginParams]:
        params: type[PluginParams] = getattr(self.get(name), "Params", PluginParams)
        return params

    def parse_params(self, name: str, raw: Mapping[str, Any] | PluginParams, path: str = "params") -> PluginParams:
        """``raw`` (camelCase keys, as in a stack file) validated by plugin ``name``'s model.

        Raises `UnknownPlugin`, or `BadParams` whose problems carry key paths below ``path``.
        """
        model = self.params_model(name)
        if isinstance(raw, model):
            return raw
        if isinstance(raw, PluginParams):
            raw = raw.model_dump(by_alias=True)
        try:
            return model.model_validate(dict(raw), by_alias=True, by_name=False)
        except ValidationError as exc:
            raise BadParams(validation_problems(exc, model, _loc(path))) from None

    def create(self, name: str, raw: Mapping[str, Any] | PluginParams | None = None) -> T:
        """An instance of plugin ``name`` built from its validated parameters (``cls(params)``)."""
        params = self.parse_params(name, raw if raw is not None else {})
        factory: Any = self.get(name)
        instance: T = factory(params)
        return instance

    def check(self, name: str, raw: Mapping[str, Any], name_path: str, params_path: str | None) -> list[Problem]:
        """Every problem of a stack's reference to plugin ``name`` (paths without the ``llmfleet:`` namespace)."""
        if name not in self._classes:
            message = f"unknown {self.kind}; registered: {', '.join(self.names())}"
            return [Problem(format_path(_loc(name_path)), message, value=name)]
        if params_path is None:
            return []
        try:
            self.parse_params(name, raw, params_path)
        except BadParams as exc:
            return exc.problems
        return []


def _loc(path: str) -> Sequence[int | str]:
    """ "gateway.routing.scorers[1].params" -> ("gateway", "routing", "scorers", 1, "params")."""
    out: list[int | str] = []
    for part in path.split("."):
        name, _, rest = part.partition("[")
        out.append(name)
        while rest:
            index, _, rest = rest.partition("]")
            out.append(int(index))
            rest = rest.removeprefix("[")
    return out


def _got(value: object) -> str:
    return "" if value is None else f" (got {value!r})"
