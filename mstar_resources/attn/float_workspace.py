"""A FlashInfer float workspace and its plan loop: a plan that overflows it (or its int
workspace) grows that buffer in place and runs again; once sealed, it is refused."""

from __future__ import annotations

import functools
import inspect
import types
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

import torch

from .._internal.floor import ENV_VAR
from ..errors import ResourceUsageError, WorkspacePlanError
from ..units import is_int, plural
from ._flashinfer import HOST_MIRROR, INT_BUFFER, buffer_views, own_buffers, refresh_recorded_size
from ._overflow import Overflow, parse_overflow
from .buffer import BufferHolder, GrowableBuffer
from .int_workspace import IntWorkspace

__all__ = ["Workspace", "install_int_workspace", "plan_through"]

T = TypeVar("T")

MAX_GROWTHS_PER_PLAN = 16
"""How many times one plan may grow a workspace. FlashInfer's allocations come in short chains
(``tmp_v`` then ``tmp_s``: two growths at most seen); the bound stops a planner that never fits."""


class Workspace(BufferHolder):
    """One FlashInfer float workspace, which wrappers plan against through :meth:`plan`.

    A workspace starts at its floor and a plan that overflows it grows it in place: ``tensor``
    stays the same object, so every wrapper built on it sees the larger buffer. Once sealed
    (before CUDA graphs are captured over it) it never moves, and a plan that does not fit raises
    :class:`WorkspaceSealedError` naming ``floor``.

    Args:
        tensor: the buffer, 1-D ``torch.uint8``, as given to FlashInfer's wrappers.
        name: how errors and logs refer to this workspace, e.g. ``attention:decode:cg0``.
        floor: the setting (config key or environment variable) that sizes its floor.
        int_workspace: the int workspace the same wrappers plan their indices into, grown by
            :meth:`plan` and sealed by :meth:`seal` with this one. None: each wrapper keeps its
            own, and an int overflow reaches the caller.
    """

    __slots__ = ("_by_kind", "_int", "_int_tensor", "_mirror", "_routes", "_sizes")

    def __init__(
        self,
        tensor: torch.Tensor,
        name: str,
        sealed: bool = False,
        floor: str = ENV_VAR,
        *,
        int_workspace: IntWorkspace | None = None,
    ) -> None:
        self._buffer = GrowableBuffer(tensor, name, sealed, floor)
        if int_workspace is not None and not isinstance(int_workspace, IntWorkspace):
            raise ResourceUsageError(
                f"workspace {name!r}: int_workspace={int_workspace!r} must be an IntWorkspace "
                "(or None: each wrapper keeps its own)"
            )
        self._int = int_workspace
        self._int_tensor = None if int_workspace is None else int_workspace.tensor
        self._mirror = None if int_workspace is None else int_workspace.mirror
        # The buffers a plan may grow, by the kind of overflow.
        self._by_kind = {"float": self._buffer}
        if int_workspace is not None:
            self._by_kind["int"] = int_workspace._buffer
        # A weak reference to each wrapper planned, by its id (:meth:`_route`): an engine's wrapper
        # often refers to itself through its attributes, and a strong one would keep it alive.
        self._routes: dict[int, Callable[[], Any]] = {}
        self._refresh()

    @property
    def int_workspace(self) -> IntWorkspace | None:
        """The int workspace the wrappers on this one plan into (None: each keeps its own)."""
        return self._int

    def plan(self, plan: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``plan(*args, **kwargs)``. One that runs short of room grows this workspace (or its
        :attr:`int_workspace` and mirror) to the bytes it had taken plus the allocation that
        failed (MLA's whole-buffer check, FlashInfer 0.7.4: to what it asked), and runs again; any
        other error reaches the caller unchanged, an int overflow of a wrapper keeping its own
        included. A wrapper on the int workspace is marked as the one whose plan it holds."""
        return self._plan(plan, args, kwargs)

    def _plan(
        self, plan: Callable[..., T], args: tuple[Any, ...], kwargs: dict[str, Any],
        failed: tuple[Exception, dict[str, int]] | None = None,
    ) -> T:  # fmt: skip
        """:meth:`plan`'s loop, entered with ``failed`` (the first run's error and the sizes it
        saw) where :func:`plan_through`'s run overflowed."""
        owner = getattr(plan, "__self__", None)
        key = owner if owner is not None else args[0] if args else None
        planner = self._routes.get(id(key))
        if planner is not None:
            attributes = key.__dict__
        else:
            planner, attributes = self._route(plan, args, key)
        growths, last = 0, None
        while True:
            if failed is not None:
                raised, seen = failed
                last = self._grow_for(raised, (plan, args, kwargs), planner(), seen, growths, last)
                growths += 1
                self._refresh(plan, attributes)
            # The mirror is the int workspace's to hand out only to a wrapper planning on it.
            int_workspace = self._int
            if int_workspace is not None and attributes.get(INT_BUFFER) is self._int_tensor:
                attributes[HOST_MIRROR] = self._mirror
            else:
                int_workspace = None
            sizes = self._sizes
            try:
                planned = plan(*args, **kwargs)
            except (RuntimeError, ValueError) as error:  # MLA's check raises ValueError
                failed = (error, sizes)
            else:
                if int_workspace is not None:
                    int_workspace.last_planner = planner
                return planned

    def _refresh(
        self, plan: Callable[..., Any] | None = None, attributes: dict[str, Any] | None = None
    ) -> None:
        """After a growth, and as a route is found: the sizes a plan reads as it starts (replaced,
        never changed), and the recorded size of every remembered wrapper, ``plan``'s object (a
        cascade level records one too) and ``attributes``' wrapper."""
        self._sizes = {kind: buffer.tensor.numel() for kind, buffer in self._by_kind.items()}
        wrappers = [getattr(plan, "__self__", None), *(p() for p in list(self._routes.values()))]
        for each in [attributes, *(getattr(w, "__dict__", None) for w in wrappers)]:
            if each is not None:
                refresh_recorded_size(each, self._buffer.tensor)

    def _grow_for(
        self, error: Exception, call: tuple[Callable[..., Any], Any, Any], wrapper: Any,
        seen: dict[str, int], growths: int, last: Overflow | None,
    ) -> Overflow:  # fmt: skip
        """Grow the buffer a failed ``call`` (plan, args, kwargs) ran short of and return the
        overflow; raise ``error`` where it is no shortage of ours, or the library's error where
        the buffer is sealed or growing did not help."""
        overflow = parse_overflow(error)
        short = None if overflow is None else self._by_kind.get(overflow.kind)
        # Not ours: an allocator with more room than this buffer holds, or an int overflow of a
        # wrapper not found planning on this int workspace (one keeping its own overflowed that).
        if (
            short is None
            or overflow is None
            or overflow.available > seen[overflow.kind]
            or (overflow.kind == "int" and getattr(wrapper, INT_BUFFER, None) is not short.tensor)
        ):
            raise error
        planned_on = seen[overflow.kind]
        if short.sealed:
            whole = _whole_plan_need(*call, short.kind.size_query_index)
            raise short.sealed_error(overflow, whole) from error
        if overflow == last:
            advice = (
                "build the wrapper on workspace.tensor (or with WorkspacePool.build)"
                if overflow.kind == "float"
                else "give the wrapper this int workspace with WorkspacePool.install"
            )
            raise WorkspacePlanError(
                f"workspace {short.name!r} grew to {planned_on:,} bytes, yet the plan reports the "
                f"same overflow again ({overflow.allocation}, {overflow.size:,} bytes): it does "
                f"not plan on this workspace's tensor; {advice}",
                workspace=short.name,
                held_bytes=planned_on,
            ) from error
        # Given the room it asked for, an allocation that asks again (for more) never fits: growing
        # on would double the workspace until memory ran out. FlashInfer's chains ask once each.
        asks_again = last is not None and last.allocation == overflow.allocation
        if growths == MAX_GROWTHS_PER_PLAN or asks_again:
            raise WorkspacePlanError(
                f"workspace {short.name!r}: the plan still overflows after "
                f"{plural(growths, 'growth')} (now {planned_on:,} bytes, "
                f"{overflow.allocation} asked for {overflow.size:,} more"
                f"{', again after it was given what it asked' if asks_again else ''}); "
                "the planner does not converge, and the workspace grows no further",
                workspace=short.name,
                held_bytes=planned_on,
            ) from error
        short.grow(overflow, planned_on, error)
        return overflow

    def _route(
        self, plan: Callable[..., Any], args: tuple[Any, ...], key: Any
    ) -> tuple[Callable[[], Any], dict[str, Any]]:
        """A weak reference to the wrapper ``plan`` plans (the bound ``plan``'s object, else its
        first argument, as vLLM's ``fast_plan_decode(wrapper, ...)``) and its attributes ({}: none
        found), after refusing its views; remembered by id until it dies, where it is ``key``."""
        owner = getattr(plan, "__self__", None)
        wrapper, attributes = None, {}
        for candidate in (owner, args[0] if args else None):
            own = own_buffers(candidate)
            if own is not None:
                wrapper, attributes = candidate, own
                break
        self._refuse_views(owner if owner is not None else wrapper)
        self._refresh(plan, attributes)
        if wrapper is None:
            return (lambda: None), attributes
        routes, wrapper_id = self._routes, id(wrapper)
        try:
            planner = weakref.ref(wrapper, lambda _: routes.pop(wrapper_id, None))
        except TypeError:  # no weak references to it: found again at every plan
            return (lambda: wrapper), attributes
        if wrapper is key:
            routes[wrapper_id] = planner
        return planner, attributes

    def _refuse_views(self, wrapper: Any) -> None:
        """Refuse a wrapper holding a view of this buffer while it can grow (a sealed one never
        moves): checked as its route is found, so once for a remembered wrapper."""
        views = [] if wrapper is None or self._buffer.sealed else buffer_views(wrapper, self.tensor)
        if not views:
            return
        raise WorkspacePlanError(
            f"workspace {self.name!r} can grow, and the {type(wrapper).__name__} planning "
            f"on it holds views of its buffer ({', '.join(views)}), which growing would "
            "leave on the old memory; give the workspace room for every plan up front "
            f"({self.floor}) and seal it before this wrapper plans",
            workspace=self.name,
            held_bytes=self.tensor.numel(),
        )

    def seal(self) -> None:
        """:meth:`BufferHolder.seal`, and the int workspace's too."""
        super().seal()
        if self._int is not None:
            self._int.seal()

    # What its pool asks of it when a group of ranks seals together (pool.py).
    def _refuse_growth(self, refused: bool) -> None:
        for buffer in self._by_kind.values():
            buffer.refuse_growth(refused)

    def _grow_to_agree(self, nbytes: int, ranks: str) -> int:
        added = self._buffer.grow_to_agree(nbytes, ranks)
        if added:
            self._refresh()
        return added


def plan_through(workspace: Workspace, plan: Callable[..., T]) -> Callable[..., T]:
    """``plan`` as ``workspace`` plans it: calling the result is ``workspace.plan(plan, ...)``.
    Made once and put where an engine calls its planner, it runs the common case (a wrapper
    planned before, a plan that fits) itself, with ``plan``'s own parameters: an engine's
    arguments bind once, with no tuple and dict made of them (vLLM passes 16 keywords a plan)."""
    owner = getattr(plan, "__self__", None)
    scope: dict[str, Any] = {
        "workspace": workspace, "plan": plan, "owner": owner, "routes": workspace._routes,
        "INT_BUFFER": INT_BUFFER, "HOST_MIRROR": HOST_MIRROR,
    }  # fmt: skip
    source = _PLANNED.format_map(_forwarding(plan, owner is not None, scope))
    name = getattr(plan, "__qualname__", type(plan).__qualname__)
    exec(compile(source, f"<plan_through of {name}>", "exec"), scope)
    planned: Callable[..., T] = scope["planned"]
    return functools.wraps(plan)(planned)


# plan_through's function: ``parameters`` the plan's own, ``forward`` them passed on, ``args`` and
# ``kwargs`` them as a tuple and a dict, ``key`` the wrapper. Each object read costs here: an
# engine's forward pass leaves the host's caches cold.
_PLANNED = """
def planned({parameters}):
    key = {key}
    # A route is dropped as its wrapper dies, before its id can be another object's.
    planner = routes.get(id(key))
    if planner is None:
        return workspace._plan(plan, {args}, {kwargs})
    sizes = workspace._sizes  # what the plan sees, whatever another thread grows
    attributes = key.__dict__  # a remembered route's wrapper is the key
    int_workspace = workspace._int
    if int_workspace is not None and attributes.get(INT_BUFFER) is workspace._int_tensor:
        attributes[HOST_MIRROR] = workspace._mirror
    else:
        int_workspace = None
    try:
        result = plan({forward})
    except (RuntimeError, ValueError) as error:  # MLA's check raises ValueError
        return workspace._plan(plan, {args}, {kwargs}, (error, sizes))
    if int_workspace is not None:
        int_workspace.last_planner = planner
    return result
"""
_ANY_CALL = {"parameters": "*args, **kwargs", "forward": "*args, **kwargs", "args": "args",
             "kwargs": "kwargs", "key": "args[0] if args else None"}  # fmt: skip
_TAKEN = {  # the names of _PLANNED a parameter of the plan's may not have
    name
    for code in compile(_PLANNED.format_map(_ANY_CALL), "", "exec").co_consts
    if isinstance(code, types.CodeType)
    for name in code.co_varnames + code.co_names
} - {"args", "kwargs"} | {"owner"}


class _Named(str):
    """A default written as its name in a signature's text."""

    __repr__ = str.__str__


def _forwarding(plan: Callable[..., Any], bound: bool, defaults: dict[str, Any]) -> dict[str, str]:
    """The pieces of :data:`_PLANNED` for ``plan``'s parameters, their defaults put in
    ``defaults``. ``Workspace._plan`` gets the arguments by name where it can, as
    ``workspace_size()`` takes them (the wrapper first of an unbound plan)."""
    try:
        parameters = list(inspect.signature(plan).parameters.values())
    except (TypeError, ValueError):  # no signature Python can read (some builtins)
        parameters = []
    if not parameters or any(p.name in _TAKEN or p.name.startswith("default_") for p in parameters):
        return {**_ANY_CALL, "key": "owner" if bound else _ANY_CALL["key"]}
    kind = inspect.Parameter
    stars: dict[Any, str] = {kind.VAR_POSITIONAL: "*", kind.VAR_KEYWORD: "**"}
    starred = kind.VAR_POSITIONAL in {p.kind for p in parameters}
    written: list[inspect.Parameter] = []
    forward: list[str] = []
    args: list[str] = []
    kwargs: list[str] = []
    for i, p in enumerate(parameters):
        if p.default is not p.empty:
            defaults[f"default_{i}"], p = p.default, p.replace(default=_Named(f"default_{i}"))
        written.append(p.replace(annotation=p.empty))
        as_given = stars.get(p.kind, "") + p.name
        forward.append(f"{p.name}={p.name}" if p.kind is kind.KEYWORD_ONLY else as_given)
        if p.kind is kind.KEYWORD_ONLY or (
            p.kind is kind.POSITIONAL_OR_KEYWORD and not starred and (bound or i > 0)
        ):
            kwargs.append(f"{p.name}={p.name}")
        else:
            (kwargs if p.kind is kind.VAR_KEYWORD else args).append(as_given)
    in_place = parameters[0].kind in (kind.POSITIONAL_ONLY, kind.POSITIONAL_OR_KEYWORD)
    return {
        "parameters": str(inspect.Signature(written))[1:-1],
        "forward": ", ".join(forward),
        "args": f"({', '.join(args)},)" if args else "()",
        "kwargs": f"dict({', '.join(kwargs)})",
        "key": "owner" if bound else parameters[0].name if in_place else "None",
    }


def _whole_plan_need(plan: Callable[..., Any], args: Any, kwargs: Any, index: int) -> int | None:
    """What the whole plan needs of one buffer (``index`` 0: float, 1: int), where its wrapper
    answers ``workspace_size()`` (float bytes, int bytes) given the plan's arguments (those it
    takes by name), as decode and paged-prefill wrappers do; else None."""
    query = getattr(getattr(plan, "__self__", None), "workspace_size", None)
    if not callable(query):
        return None
    try:
        taken = inspect.signature(query).parameters
        if all(p.kind is not inspect.Parameter.VAR_KEYWORD for p in taken.values()):
            kwargs = {name: value for name, value in kwargs.items() if name in taken}
        answer = query(*args, **kwargs)
        need = answer[index] if isinstance(answer, tuple) else (answer if index == 0 else None)
    except Exception:  # not this wrapper's arguments, or no query for its backend
        return None
    return need if is_int(need) else None


def install_int_workspace(wrapper: Any, workspace: Workspace) -> bool:
    """Give ``wrapper`` the int workspace of ``workspace`` and its mirror in place of its own;
    False, ``wrapper`` untouched, where the workspace has none (an int floor of 0) or the wrapper
    keeps none to replace (:func:`own_buffers`)."""
    own = own_buffers(wrapper)
    int_workspace = workspace.int_workspace
    if int_workspace is None or own is None:
        return False
    # Assigned, not reset_workspace_buffer(): that would allocate a pinned mirror of its own.
    own[INT_BUFFER] = int_workspace.tensor
    own[HOST_MIRROR] = int_workspace.mirror
    run = own.get("run") or getattr(wrapper, "run", None)
    run = getattr(run, "_unchecked", run)  # given another int workspace before: not that check
    if callable(run):

        @functools.wraps(run)
        def checked_run(*args: Any, **kwargs: Any) -> Any:
            int_workspace.check_planned_by(wrapper)
            return run(*args, **kwargs)

        # Not functools' __wrapped__: FlashInfer 0.7 decorates run() itself, and its __wrapped__
        # is the undecorated, unbound function.
        checked_run._unchecked = run  # type: ignore[attr-defined]
        own["run"] = checked_run
    return True
