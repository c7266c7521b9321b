"""How a setting is declared once: type, default, choices, help and scope.

A settings class is a plain dataclass whose every field is made with :func:`setting`, and which is
decorated with :func:`declared`. The type comes from the annotation, the default from the field,
the rest from :class:`Setting` in the field's metadata. Everything else is derived from that one
declaration: the command-line options (:mod:`dacflnode.cli.options`), the YAML parsing of
``--config`` and of a peers file's ``run:`` and ``node:`` sections (:func:`from_mapping`), the
handshake fingerprint (:mod:`dacflnode.config.fingerprint`) and ``docs/configuration.md``
(:mod:`dacflnode.config.docs`).

Why stdlib dataclasses and not pydantic v2: the settings are ~40 flat scalars and five small
coercion rules (bool, int, float, str, comma list), which fit in :func:`coerce` below. pydantic
would add a dependency to a daemon whose only other config code is this, and it would remove
few lines: its validation errors would still have to be caught and rewritten into today's
one-line :class:`~dacflnode.errors.ConfigError` that names the dotted key (``run.lr_decay``) and
the file, and the cross-field checks (graph, matrix, data folder) stay hand-written either way.
Field metadata keeps the declaration next to the default and costs nothing at import.

A field without a :class:`Setting` is a ``TypeError`` when its class is defined, so a new
setting cannot be added without saying whether it must match across the run.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import types
import typing
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from dacflnode.config.reader import describe, type_name
from dacflnode.errors import ConfigError

T = TypeVar("T")

_KEY = "dacflnode.setting"

#: The sections a command's ``--help`` sorts its options into, in order (titles in
#: :mod:`dacflnode.cli.options`): what a run is, its data, model, training, topology and mixing,
#: evaluation, how it runs (devices, deadlines), its network and security, and what it prints.
OPTION_GROUPS = (
    "run", "data", "model", "training", "topology", "evaluation", "runtime", "network", "output",
)


class Scope(enum.StrEnum):
    """Who a setting belongs to."""

    #: Shared by every node of a run: part of the handshake fingerprint (when relevant), so
    #: nodes that disagree refuse each other.
    RUN = "run"
    #: Local to one node (paths on its host, its device, its deadlines, how often it
    #: evaluates); never part of the fingerprint, nodes may differ.
    NODE = "node"


@dataclass(frozen=True)
class Setting:
    """The declaration of one setting besides its type and default.

    ``relevant`` (run scope only) says when the value can change the run; the fingerprint skips
    it otherwise (the Dirichlet alpha matters only when ``partition`` is ``dirichlet``), and
    ``relevant_text`` says the same in words for the docs. ``fingerprint`` maps the settings
    object to the value hashed when the stored value is not the effective one (an unset ``lr``
    is the data set's default). ``default_text`` describes a default that is computed.

    For the command-line options: ``group`` is the section of ``--help`` the option is listed
    in (one of :data:`OPTION_GROUPS`; required when ``cli``). The cluster commands (``launch``,
    ``topology``) run daemons, which train one model each over a graph: they leave out a
    ``simulator_only`` setting, and offer ``cluster_choices`` (and say ``cluster_help``) where
    a daemon accepts fewer values than the simulator.
    """

    help: str
    scope: Scope
    choices: tuple[str, ...] | None = None
    noun: str | None = None
    minimum: int | float | None = None
    above: float | None = None
    maximum: float | None = None
    below: float | None = None
    default_text: str | None = None
    relevant: Callable[[Any], bool] | None = None
    relevant_text: str | None = None
    fingerprint: Callable[[Any], Any] | None = None
    metavar: str | None = None
    cli: bool = True
    group: str | None = None
    simulator_only: bool = False
    cluster_choices: tuple[str, ...] | None = None
    cluster_help: str | None = None

    def __post_init__(self) -> None:
        if self.cli and self.group not in OPTION_GROUPS:
            raise TypeError(
                f"a command-line setting needs group= one of {', '.join(OPTION_GROUPS)},"
                f" got {self.group!r}"
            )
        if self.cluster_choices is not None and (
            self.choices is None or not set(self.cluster_choices) <= set(self.choices)
        ):
            raise TypeError("cluster_choices must be some of choices")
        if not isinstance(self.scope, Scope):
            raise TypeError(f"scope must be a Scope, got {self.scope!r}")
        if self.scope is Scope.NODE and (self.relevant or self.fingerprint):
            raise TypeError("a node-local setting is never fingerprinted")
        if (self.relevant is None) != (self.relevant_text is None):
            raise TypeError("give relevant and relevant_text together")


def setting(
    default: Any,
    *,
    help: str,
    scope: Scope,
    choices: tuple[str, ...] | None = None,
    noun: str | None = None,
    minimum: int | float | None = None,
    above: float | None = None,
    maximum: float | None = None,
    below: float | None = None,
    default_text: str | None = None,
    relevant: Callable[[Any], bool] | None = None,
    relevant_text: str | None = None,
    fingerprint: Callable[[Any], Any] | None = None,
    metavar: str | None = None,
    cli: bool = True,
    group: str | None = None,
    simulator_only: bool = False,
    cluster_choices: tuple[str, ...] | None = None,
    cluster_help: str | None = None,
) -> Any:
    """A dataclass field carrying its :class:`Setting` (``default`` must be immutable)."""
    meta = Setting(
        help=help,
        scope=scope,
        choices=choices,
        noun=noun,
        minimum=minimum,
        above=above,
        maximum=maximum,
        below=below,
        default_text=default_text,
        relevant=relevant,
        relevant_text=relevant_text,
        fingerprint=fingerprint,
        metavar=metavar,
        cli=cli,
        group=group,
        simulator_only=simulator_only,
        cluster_choices=cluster_choices,
        cluster_help=cluster_help,
    )
    return dataclasses.field(default=default, metadata={_KEY: meta})


@dataclass(frozen=True)
class Declared:
    """One declared field: its name, resolved type, default and :class:`Setting`."""

    name: str
    hint: Any
    default: Any
    setting: Setting

    @property
    def options(self) -> tuple[Any, ...]:
        """The member types of the annotation (``int | None`` -> ``(int, NoneType)``)."""
        if isinstance(self.hint, types.UnionType):
            return typing.get_args(self.hint)
        return (self.hint,)

    @property
    def optional(self) -> bool:
        return type(None) in self.options

    @property
    def base(self) -> Any:
        """The annotation without ``None``: ``int``, ``float``, ``str``, ``bool`` or a tuple."""
        rest = [t for t in self.options if t is not type(None)]
        return rest[0]

    @property
    def is_list(self) -> bool:
        return typing.get_origin(self.base) is tuple

    @property
    def section(self) -> type[Any] | None:
        """The declared settings class of a nested mapping (``node.tls``), else ``None``."""
        base = self.base
        return base if isinstance(base, type) and dataclasses.is_dataclass(base) else None

    @property
    def item(self) -> Any:
        """The element type of a list setting (``str``, or ``tuple[str, str]`` for pairs)."""
        return typing.get_args(self.base)[0]

    @property
    def default_text(self) -> str:
        """How the default reads in help texts and in ``docs/configuration.md``."""
        if self.setting.default_text is not None:
            return self.setting.default_text
        if self.default is None:
            return "none"
        if isinstance(self.default, bool):
            return "on" if self.default else "off"
        if isinstance(self.default, tuple):
            return ",".join(str(v) for v in self.default) or "none"
        return f"{self.default:g}" if isinstance(self.default, float) else str(self.default)

    @property
    def flag(self) -> str:
        """The command-line spelling: ``--batch-size``."""
        return "--" + self.name.replace("_", "-")


def declared(cls: type[T]) -> type[T]:
    """Class decorator: check that every field of the dataclass ``cls`` is a :func:`setting`."""
    fields_of(cls)
    return cls


def fields_of(cls: type[Any]) -> tuple[Declared, ...]:
    """The declared fields of ``cls`` in declaration order; ``TypeError`` for an undeclared one."""
    cached: tuple[Declared, ...] | None = cls.__dict__.get("__declared__")
    if cached is not None:
        return cached
    hints = typing.get_type_hints(cls)
    out: list[Declared] = []
    for f in dataclasses.fields(cls):
        meta = f.metadata.get(_KEY)
        if not isinstance(meta, Setting):
            raise TypeError(
                f"{cls.__name__}.{f.name} is not declared with setting(): give it a help text"
                " and a scope (Scope.RUN if every node of a run must agree on it, else NODE)"
            )
        if f.default is dataclasses.MISSING:
            raise TypeError(f"{cls.__name__}.{f.name} has no default")
        out.append(Declared(f.name, hints[f.name], f.default, meta))
    result = tuple(out)
    type.__setattr__(cls, "__declared__", result)
    return result


def field_of(cls: type[Any], name: str) -> Declared:
    for d in fields_of(cls):
        if d.name == name:
            return d
    raise KeyError(name)


def names_of(cls: type[Any]) -> tuple[str, ...]:
    return tuple(d.name for d in fields_of(cls))


# ---------------------------------------------------------------------------------------- values
def coerce(d: Declared, value: Any, exact: bool = False) -> Any:
    """``value`` (from YAML or a flag) as the declared type; ConfigError naming the field.

    ``exact``: the value must already have the declared type, as a YAML file writes it (no
    ``'yes'`` for true, no number for a string): for sections only a file holds, whose strings
    may be secrets (an error names a wrong string's type, never its value).
    """
    name = d.name
    if value is None:
        if d.optional:
            return None
        raise ConfigError(name, "must not be empty")
    if d.section is not None:
        if not isinstance(value, Mapping):
            raise ConfigError(name, f"expected a mapping, got {describe(value)}")
        try:
            return from_mapping(d.section, value, exact=exact)
        except ConfigError as exc:
            raise ConfigError(f"{name}.{exc.field}", exc.message) from None
    if exact and not d.is_list:
        return _exact(d, value)
    if d.is_list:
        items = value.split(",") if isinstance(value, str) else value
        if not isinstance(items, list | tuple):
            raise ConfigError(name, f"expected a comma list, got {value!r}")
        # names with choices (algorithms) are case-blind; free names (classes) keep their case
        fold = str.lower if d.setting.choices is not None else str
        return tuple(fold(str(v).strip()) for v in items if str(v).strip())
    base = d.base
    if base is bool:
        if isinstance(value, bool):
            return value
        if str(value).lower() in ("true", "yes", "1", "on"):
            return True
        if str(value).lower() in ("false", "no", "0", "off"):
            return False
        raise ConfigError(name, f"expected true or false, got {value!r}")
    if base is int:
        if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
            raise ConfigError(name, f"expected an integer, got {value!r}")
        try:
            return int(value)
        except (TypeError, ValueError):
            raise ConfigError(name, f"expected an integer, got {value!r}") from None
    if base is float:
        try:
            number = float(value) if not isinstance(value, bool) else math.nan
        except (TypeError, ValueError):
            number = math.nan
        if not math.isfinite(number):
            raise ConfigError(name, f"expected a number, got {value!r}")
        return number
    if base is str:
        if isinstance(value, Mapping | list):
            raise ConfigError(name, f"expected a single value, got {value!r}")
        return str(value)
    raise ConfigError(name, f"unsupported value {value!r}")


def _exact(d: Declared, value: Any) -> Any:
    """``value`` if it has ``d``'s scalar type as YAML writes it (see :func:`coerce`)."""
    base = d.base
    if base is bool and isinstance(value, bool):
        return value
    is_int = isinstance(value, int) and not isinstance(value, bool)
    if base is int and is_int:
        return value
    if base is float and (is_int or isinstance(value, float)) and math.isfinite(value):
        return float(value)
    if base is str and isinstance(value, str):
        return value
    expected = {bool: "true or false", int: "an integer", float: "a number"}
    if base in expected:
        raise ConfigError(d.name, f"expected {expected[base]}, got {value!r}")
    raise ConfigError(d.name, f"expected a string, got {type_name(value)}")


def from_mapping(
    cls: type[T], values: Mapping[str, Any], base: T | None = None, exact: bool = False
) -> T:
    """Apply ``values`` (snake_case or kebab-case keys; ``None`` = "not given" only for
    optional fields) over ``base`` or the defaults; unknown keys name themselves. ``exact``:
    see :func:`coerce`."""
    known = {d.name: d for d in fields_of(cls)}
    changes: dict[str, Any] = {}
    for raw_key, value in values.items():
        key = str(raw_key).replace("-", "_")
        if key not in known:
            raise ConfigError(str(raw_key), "unknown option")
        changes[key] = coerce(known[key], value, exact)
    start = base if base is not None else cls()
    return dataclasses.replace(start, **changes)  # type: ignore[type-var]


def check(obj: Any) -> None:
    """The declared checks of every field of ``obj``: choices and lower bounds."""
    for d in fields_of(type(obj)):
        value = getattr(obj, d.name)
        if value is None:
            continue
        s = d.setting
        if s.choices is not None:
            for item in value if d.is_list else (value,):
                if item not in s.choices:
                    noun = s.noun or d.name.replace("_", " ")
                    raise ConfigError(
                        d.name, f"unknown {noun} '{item}' (choose from {', '.join(s.choices)})"
                    )
        if s.minimum is not None and value < s.minimum:
            raise ConfigError(d.name, f"must be >= {s.minimum:g}, got {value}")
        if s.above is not None and not value > s.above:
            raise ConfigError(d.name, f"must be > {s.above:g}, got {value}")
        if s.maximum is not None and value > s.maximum:
            raise ConfigError(d.name, f"must be <= {s.maximum:g}, got {value}")
        if s.below is not None and not value < s.below:
            raise ConfigError(d.name, f"must be < {s.below:g}, got {value}")


def run_scoped(obj: Any) -> Iterator[tuple[str, Any]]:
    """``(name, value)`` of each run-scoped field of ``obj`` that is relevant to it, with the
    value the fingerprint hashes."""
    for d in fields_of(type(obj)):
        s = d.setting
        if s.scope is not Scope.RUN:
            continue
        if s.relevant is not None and not s.relevant(obj):
            continue
        yield d.name, (s.fingerprint(obj) if s.fingerprint is not None else getattr(obj, d.name))
