"""A FlashInfer float workspace and its plan loop: a plan that overflows it (or its int
workspace) grows that buffer in place and runs again; once sealed, it is refused."""

from __future__ import annotations

import contextlib
import functools
import inspect
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from ..errors import ResourceUsageError, WorkspacePlanError
from ..floor import ENV_VAR
from ..units import is_int, plural
from ._buffer import GrowableBuffer
from ._flashinfer import (
    HOST_MIRROR,
    INT_BUFFER,
    XQA_DECODE_RUN,
    XQA_DECODE_RUN_NAME,
    buffer_views,
    own_buffers,
    refresh_recorded_size,
)
from ._int_workspace import IntWorkspace
from ._overflow import Overflow, parse_overflow

__all__ = ["Workspace", "install_int_workspace", "plan_through"]

T = TypeVar("T")

MAX_GROWTHS_PER_PLAN = 16
"""How many times one plan may grow a workspace. FlashInfer's allocations come in short chains
(``tmp_v`` then ``tmp_s``: two growths at most seen); the bound stops a planner that never fits."""


class Workspace(GrowableBuffer):
    """One FlashInfer float workspace, which wrappers plan against through :meth:`plan`.

    A workspace starts at its floor and a plan that overflows it grows it in place: ``tensor``
    stays the same object, so every wrapper built on it sees the larger buffer. Once sealed
    (before CUDA graphs are captured over it) it never moves, and a plan that does not fit raises
    :class:`WorkspaceSealedError` naming ``floor``.

    Args:
        tensor: the buffer, 1-D ``torch.uint8``, as given to FlashInfer's wrappers.
        name: how errors and logs refer to this workspace, e.g. ``attention:decode:cg0``.
        floor: the setting (config key or environment variable) that sizes its floor; "" where
            none does (a measurement's scratch, whose growths are logged at DEBUG).
        int_workspace: the int workspace the same wrappers plan their indices into, grown by
            :meth:`plan` and sealed by :meth:`seal` with this one. None: each wrapper keeps its
            own, and an int overflow reaches the caller.
    """

    def __init__(
        self,
        tensor: torch.Tensor,
        name: str,
        sealed: bool = False,
        floor: str = ENV_VAR,
        *,
        int_workspace: IntWorkspace | None = None,
    ) -> None:
        super().__init__(tensor, name, sealed, floor)
        if int_workspace is not None and not isinstance(int_workspace, IntWorkspace):
            raise ResourceUsageError(
                f"workspace {name!r}: int_workspace={int_workspace!r} must be an IntWorkspace "
                "(or None: each wrapper keeps its own)"
            )
        self._int = int_workspace
        # The buffers a plan may grow, by the kind of overflow.
        self._by_kind: dict[str, GrowableBuffer] = {"float": self}
        if int_workspace is not None:
            self._by_kind["int"] = int_workspace
        # A weak reference to each wrapper planned, by its id (:meth:`_route`): an engine's wrapper
        # often refers to itself through its attributes, and a strong one would keep it alive.
        self._routes: dict[int, _Route] = {}
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

    def _plan(self, plan: Callable[..., T], args: tuple[Any, ...], kwargs: dict[str, Any]) -> T:
        """:meth:`plan`, its arguments as they came (a planner's own ``plan=`` passes through)."""
        # The wrapper planned: the bound plan's object, else the first argument (vLLM's
        # ``fast_plan_decode(wrapper, ...)``); found once, then remembered until it dies.
        wrapper = getattr(plan, "__self__", None)
        if wrapper is None and args:
            wrapper = args[0]
        route = self._routes.get(id(wrapper)) or self._route(wrapper)
        attributes = route.attributes
        growths, last = 0, None
        while True:
            # What the plan sees, whatever another thread grows: the wrapper's record of its
            # buffer's size and the growth after an overflow both read this one snapshot.
            sizes = self._sizes
            if route.sizes is not sizes:  # first planned, or grown since it last planned
                route.sizes = sizes
                refresh_recorded_size(attributes, self.tensor, sizes["float"])
            # The mirror is the int workspace's to hand out only to a wrapper planning on it.
            lends_mirror = self._int is not None and attributes.get(INT_BUFFER) is self._int.tensor
            if lends_mirror:
                attributes[HOST_MIRROR] = self._int.mirror  # type: ignore[union-attr]
            try:
                planned = plan(*args, **kwargs)
            except (RuntimeError, ValueError) as error:  # MLA's check raises ValueError
                last = self._grow_for(error, (plan, args, kwargs), route.wrapper(), sizes,
                                      growths, last)  # fmt: skip
                growths += 1
                self._refresh()
                continue
            if attributes.get(XQA_DECODE_RUN):
                self._hold_xqa_run(attributes, (plan, args, kwargs))
            if lends_mirror:
                self._int.last_planner = route.wrapper  # type: ignore[union-attr]
            return planned

    def _hold_xqa_run(
        self, attributes: dict[str, Any], call: tuple[Callable[..., Any], Any, Any]
    ) -> None:
        """Grow this workspace to the most the XQA run of a decode plan (``call``) can touch, or
        refuse the plan once sealed: XQA checks nothing of the workspace it is given."""
        try:
            need = _xqa_run_bytes(attributes, *call, self.tensor.device)
        except (KeyError, TypeError, AttributeError, ValueError) as error:  # not 0.7.4's names
            raise WorkspacePlanError(
                f"workspace {self.name!r}: FlashInfer's decode wrapper will run this plan on XQA, "
                f"which checks nothing of the workspace, and what it touches can't be read here "
                f"({type(error).__name__}: {error}); plan with use_tensor_cores=False or one query "
                "token a request, or use the FlashInfer this library was read in (0.7.4)",
                workspace=self.name,
                held_bytes=self.tensor.numel(),
            ) from error
        have = self.tensor.numel()
        if need > have:
            self._grow(Overflow(XQA_DECODE_RUN_NAME, need, 1, 0, whole_buffer=True), have, None)
            self._refresh()

    def _refresh(self) -> None:
        """The sizes a plan reads as it starts: replaced, never changed, after each growth."""
        self._sizes = {kind: buffer.tensor.numel() for kind, buffer in self._by_kind.items()}

    def _grow_for(
        self, error: Exception, call: tuple[Callable[..., Any], Any, Any], wrapper: Any,
        seen: dict[str, int], growths: int, last: Overflow | None,
    ) -> Overflow | None:  # fmt: skip
        """Grow the buffer a failed ``call`` (plan, args, kwargs) ran short of and return the
        overflow; raise ``error`` where it is no shortage of ours, or the library's error where
        the buffer is sealed or growing did not help."""
        overflow = parse_overflow(error)
        if overflow is None or overflow.kind not in self._by_kind:
            raise error
        short, planned_on = self._by_kind[overflow.kind], seen[overflow.kind]
        # Another plan grew it after this one read its size (a decode plan reads the tensor's own):
        # the overflow was measured against neither size, so it is planned again on the new one.
        if short.tensor.numel() != planned_on:
            return last
        # Not ours: an allocator with more room than this buffer holds, or an int overflow of a
        # wrapper not found planning on this int workspace (one keeping its own overflowed that).
        if overflow.available > planned_on or (
            overflow.kind == "int" and getattr(wrapper, INT_BUFFER, None) is not short.tensor
        ):
            raise error
        if short.sealed:
            whole = _whole_plan_need(*call, short._kind.size_query_index)
            said_by = "FlashInfer's workspace_size()"
            if overflow.kind == "float" and getattr(wrapper, XQA_DECODE_RUN, False):
                # Its run goes to XQA, whose bound workspace_size() does not give (it raises).
                with contextlib.suppress(KeyError, TypeError, AttributeError, ValueError):
                    whole = _xqa_run_bytes(vars(wrapper), *call, short.tensor.device)
                    said_by = f"the bound of {XQA_DECODE_RUN_NAME}"
            raise short._sealed_error(overflow, whole, said_by) from error
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
        if growths >= MAX_GROWTHS_PER_PLAN or asks_again:
            raise WorkspacePlanError(
                f"workspace {short.name!r}: the plan still overflows after "
                f"{plural(growths, 'growth')} (now {planned_on:,} bytes, "
                f"{overflow.allocation} asked for {overflow.size:,} more"
                f"{', again after it was given what it asked' if asks_again else ''}); "
                "the planner does not converge, and the workspace grows no further",
                workspace=short.name,
                held_bytes=planned_on,
            ) from error
        short._grow(overflow, planned_on, error)
        return overflow

    def _route(self, wrapper: Any) -> _Route:
        """``wrapper``'s route: its attributes ({} where it has none), remembered by its id while
        it lives (one that takes no weak reference is found again at every plan). A wrapper
        holding a view of this buffer is refused while it can grow (a sealed one never moves)."""
        attributes = getattr(wrapper, "__dict__", None)
        if attributes is None:  # no wrapper: an int, a function
            return _Route(lambda: None, {})
        if not self.sealed and (views := buffer_views(wrapper, self.tensor)):
            raise WorkspacePlanError(
                f"workspace {self.name!r} can grow, and the {type(wrapper).__name__} planning "
                f"on it holds views of its buffer ({', '.join(views)}), which growing would "
                "leave on the old memory; give the workspace room for every plan up front "
                f"({self.floor}) and seal it before this wrapper plans",
                workspace=self.name,
                held_bytes=self.tensor.numel(),
            )
        routes, wrapper_id = self._routes, id(wrapper)
        try:
            reference = weakref.ref(wrapper, lambda _: routes.pop(wrapper_id, None))
        except TypeError:
            return _Route(lambda: wrapper, attributes)
        route = routes[wrapper_id] = _Route(reference, attributes)
        return route

    def seal(self) -> None:
        """Keep this buffer's address from now on, and the int workspace's too: graphs are about
        to be captured over them."""
        super().seal()
        if self._int is not None:
            self._int.seal()

    # What its pool asks of it when a group of ranks seals together (pool.py).
    def _refuse_growth(self, refused: bool) -> None:
        super()._refuse_growth(refused)
        if self._int is not None:
            self._int._refuse_growth(refused)

    def _grow_to_agree(self, nbytes: int, ranks: str, int_nbytes: int = 0) -> int:
        added = super()._grow_to_agree(nbytes, ranks)
        if self._int is not None:
            added += self._int._grow_to_agree(int_nbytes, ranks)
        if added:
            self._refresh()
        return added


@dataclass(slots=True)
class _Route:
    """What :meth:`Workspace.plan` remembers of a wrapper: a (weak) reference to it, its
    attributes, and the workspace's sizes when it last planned."""

    wrapper: Callable[[], Any]
    attributes: dict[str, Any]
    sizes: dict[str, int] | None = None


def plan_through(workspace: Workspace, plan: Callable[..., T]) -> Callable[..., T]:
    """``plan`` as ``workspace`` plans it: calling the result is ``workspace.plan(plan, ...)``,
    made once and put where an engine calls its planner (``wraps`` keeps ``plan``'s name). A
    bound ``plan``'s wrapper is held weakly, so the result may be set on the wrapper itself
    without keeping it alive in a cycle."""
    function: Any = getattr(plan, "__func__", None)
    try:
        this = None if function is None else weakref.ref(plan.__self__)  # type: ignore[attr-defined]
    except TypeError:  # its object takes no weak reference: held as the bound plan holds it
        this = None
    if this is None:

        @functools.wraps(plan)
        def planned(*args: Any, **kwargs: Any) -> T:
            return workspace._plan(plan, args, kwargs)

        return planned

    @functools.wraps(function)
    def planned_on_wrapper(*args: Any, **kwargs: Any) -> T:
        if (wrapper := this()) is None:
            raise ResourceUsageError(
                f"{function.__qualname__} was called through workspace {workspace.name!r} "
                "after its wrapper was freed; plan on a wrapper that is alive"
            )
        bound: Callable[..., T] = function.__get__(wrapper)
        return workspace._plan(bound, args, kwargs)

    return planned_on_wrapper


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


def sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


@functools.lru_cache(maxsize=64)
def _parameters(function: Callable[..., Any]) -> tuple[str, ...]:
    return tuple(inspect.signature(function).parameters)


@functools.lru_cache(maxsize=256)
def _xqa_bound(**shape: Any) -> int:
    from .trtllm_workspace import xqa_workspace_bytes

    return xqa_workspace_bytes(**shape)


def _xqa_run_bytes(
    attributes: dict[str, Any],
    plan: Callable[..., Any],
    args: Any,
    kwargs: Any,
    device: torch.device,
) -> int:
    """What the XQA run of a decode wrapper's plan (``plan(*args, **kwargs)``, which left the
    wrapper's ``attributes``) can touch of its float workspace: every launch of up to the plan's
    batch on its page table (:func:`~.trtllm_workspace.xqa_workspace_bytes`)."""
    function = getattr(plan, "__func__", None)
    if function is not None:  # bound: its wrapper is the first parameter
        args = (plan.__self__, *args)  # type: ignore[attr-defined]
    given = {**dict(zip(_parameters(function or plan), args, strict=False)), **kwargs}
    return _xqa_bound(
        batch=attributes["_batch_size"],
        num_qo_heads=attributes["_num_qo_heads"],
        num_kv_heads=attributes["_num_kv_heads"],
        head_dim=given["head_dim"],
        max_seq_len=attributes["_block_tables"].shape[-1] * given["page_size"],
        sm_count=sm_count(device),
        q_len_per_req=attributes["_xqa_mtp_q_len_per_req"],
        hopper_fp8_kv=attributes["_cached_kv_data_type"] == torch.float8_e4m3fn,
    )


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
    # The run it had: one set on the wrapper itself (not a check given before), else its class's,
    # called on the wrapper, which the check holds weakly: a wrapper holding a closure that held
    # it would live on in a cycle until the garbage collector ran.
    given = own.get("run")
    given = getattr(given, "_unchecked", given)
    run = given if given is not None else getattr(type(wrapper), "run", None)
    if callable(run):
        this = weakref.ref(wrapper)

        @functools.wraps(run)
        def checked_run(*args: Any, **kwargs: Any) -> Any:
            planned = this()
            int_workspace.check_planned_by(planned)
            return run(*args, **kwargs) if given is not None else run(planned, *args, **kwargs)

        # Not functools' __wrapped__: FlashInfer 0.7 decorates run() itself, and its __wrapped__
        # is the undecorated, unbound function.
        checked_run._unchecked = given  # type: ignore[attr-defined]
        own["run"] = checked_run
        if hasattr(type(wrapper), "run_return_lse"):  # partialmethod(run): the class's own run
            own["run_return_lse"] = functools.partial(checked_run, return_lse=True)
    return True
