"""Server-side tools: a Python function the model may call, its JSON schema from type hints.

```python
@tool(timeout_s=2)
def convert(value: float, unit_from: Literal["km", "mi"], unit_to: Literal["km", "mi"]) -> float:
    \"\"\"Convert a distance between kilometres and miles.\"\"\"
```

The schema is pydantic's for the function's arguments (`TypeAdapter(fn).json_schema()`;
`Annotated[float, Field(description=...)]` describes a parameter) and the same pydantic
validates the model's arguments before the call (`validate_call`). Whatever goes wrong,
bad arguments, an exception, a timeout, the model gets an error result it can read and
the reply goes on: a tool never ends a session. An exception's text stays here (it may
hold a URL with a key): the model reads its type, or the message of a `ToolError`, which a
tool raises to tell it something. Async tools are cancelled with their reply (barge-in); a
plain function runs on a thread of the gateway's `ToolPool`, where a cancelled or timed-out
one runs to its end and its result is dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import functools
import inspect
import json
import logging
import threading
import time
import traceback
from collections.abc import Awaitable, Callable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, overload

from pydantic import TypeAdapter, ValidationError, validate_call
from pydantic_core import to_jsonable_python

from services.common.redact import redact_urls
from services.gateway import metrics
from services.gateway.agent import ToolCall
from services.gateway.chat import clip

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 10.0
DEFAULT_MAX_OUTPUT_CHARS = 16_000

SESSION: ContextVar[str | None] = ContextVar("va_tool_session", default=None)
"""The session whose reply runs the tools, for `ToolPool`'s per-session limit: a session
sets it once and the tasks it starts inherit it. Unset, each reply counts alone."""


class ToolError(ValueError):
    """Raised by a tool to tell the model something ("no such order"): its message is the
    model's error result as written. Any other exception gives the model only its type.
    (A ValueError, so that a tool that raised one for the model can switch to it.)"""


class ToolsBusy(Exception):
    """Every thread for plain tools is taken (or this session's share): not run."""


class ToolPool:
    """Threads for plain (sync) tools, apart from asyncio's default executor, bounded:
    at most `threads` calls run at once, `per_session` of them one session's. A call past
    its timeout (or cancelled) keeps its thread until the function returns and counts
    until then; a call that finds no thread free is refused at once (`ToolsBusy`) instead
    of waiting behind hung ones. The threads are daemons: a hung tool never holds up the
    gateway's exit."""

    def __init__(self, threads: int = 32, per_session: int = 4) -> None:
        self.threads = threads
        self.per_session = per_session
        self._lock = threading.Lock()
        self._running: dict[object, int] = {}

    @property
    def busy(self) -> int:
        """Threads running a tool now (abandoned calls included)."""
        with self._lock:
            return sum(self._running.values())

    async def run(self, function: Callable[[], Any], owner: object) -> Any:
        """`function()` on a thread of the pool; raises ToolsBusy when none is free."""
        self._take(owner)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        returned = threading.Event()
        context = contextvars.copy_context()
        work = functools.partial(self._work, context, function, owner, returned)
        try:
            threading.Thread(target=work, args=(loop, future), name="va-tool", daemon=True).start()
        except BaseException:
            self._give(owner)
            raise
        try:
            return await future
        except asyncio.CancelledError:
            if not returned.is_set():
                metrics.TOOL_CALLS_ABANDONED.inc()  # its thread runs on, its result unread
            raise

    def _take(self, owner: object) -> None:
        with self._lock:
            if sum(self._running.values()) >= self.threads:
                raise ToolsBusy("every tool thread is busy")
            if self._running.get(owner, 0) >= self.per_session:
                raise ToolsBusy(f"this session already has {self.per_session} tools running")
            self._running[owner] = self._running.get(owner, 0) + 1

    def _give(self, owner: object) -> None:
        with self._lock:
            left = self._running[owner] - 1
            if left:
                self._running[owner] = left
            else:
                del self._running[owner]

    def _work(
        self,
        context: contextvars.Context,
        function: Callable[[], Any],
        owner: object,
        returned: threading.Event,
        loop: asyncio.AbstractEventLoop,
        future: asyncio.Future[Any],
    ) -> None:
        try:
            result = context.run(function)
        except BaseException as exc:  # handed to the caller, as an executor does
            _settle(loop, future, None, exc)
        else:
            _settle(loop, future, result, None)
        finally:
            returned.set()
            self._give(owner)


def _settle(
    loop: asyncio.AbstractEventLoop,
    future: asyncio.Future[Any],
    result: Any,
    error: BaseException | None,
) -> None:
    def settle() -> None:
        if future.done():  # cancelled: the call was given up
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
        loop.call_soon_threadsafe(settle)


@dataclass(frozen=True)
class Tool:
    """A function the model may call, with what the model is told of it."""

    name: str
    description: str
    parameters: dict[str, Any]
    """JSON schema of its arguments (an object)."""
    function: Callable[..., Any]
    side_effects: bool = False
    """It changes something outside the conversation (books, sends, buys): a reply that may
    be dropped unheard (prepared during a pause) must not run it."""
    timeout_s: float | None = None
    """None: the gateway's `VA_LLM__TOOL_TIMEOUT_S`."""

    def spec(self) -> dict[str, Any]:
        """The tool as the chat completions API takes it."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }


@overload
def tool(function: Callable[..., Any], /) -> Tool: ...


@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    side_effects: bool = False,
    timeout_s: float | None = None,
) -> Callable[[Callable[..., Any]], Tool]: ...


def tool(
    function: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    side_effects: bool = False,
    timeout_s: float | None = None,
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Make a `Tool` of a typed function (its docstring's first paragraph describes it)."""

    def make(fn: Callable[..., Any]) -> Tool:
        schema = TypeAdapter[Any](fn).json_schema()  # type: ignore[arg-type]  # a callable's arguments
        schema.pop("additionalProperties", None)  # some servers refuse it outside strict mode
        doc = inspect.getdoc(fn) or ""
        return Tool(
            name=name or fn.__name__,
            description=description if description is not None else doc.split("\n\n")[0],
            parameters=schema,
            function=validate_call(fn),
            side_effects=side_effects,
            timeout_s=timeout_s,
        )

    return make(function) if function is not None else make


@dataclass(frozen=True)
class ToolLimits:
    """How calls run: the default timeout, the longest output the model reads, the pool of
    threads for plain tools and whose calls these are (`owner`, for the pool's per-session
    limit)."""

    timeout_s: float = DEFAULT_TIMEOUT_S
    max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS
    pool: ToolPool | None = None
    """None: the module's shared pool (`SHARED_POOL`)."""
    owner: object = None
    """None: `SESSION`'s value, else this call alone."""


SHARED_POOL = ToolPool()
"""The pool of calls made without one (the `openai` agent uses its endpoint's)."""


def error_output(message: str) -> str:
    """A tool result that tells the model what went wrong."""
    return json.dumps({"error": message})


async def run_call(
    tools: dict[str, Tool], call: ToolCall, limits: ToolLimits | float = DEFAULT_TIMEOUT_S
) -> str:
    """The output of one call, as text for the model (at most `max_output_chars`: longer
    is cut, with a note saying so); never raises but for cancellation."""
    limits = _resolved(limits)
    found = tools.get(call.name)
    if found is None:
        metrics.TOOL_CALLS.labels("unknown").inc()
        return error_output(f"there is no tool {call.name!r}")
    try:
        arguments = json.loads(call.arguments or "{}")
    except (ValueError, RecursionError):  # not JSON, an int past Python's digits, too deep
        metrics.TOOL_CALLS.labels("bad_arguments").inc()
        return error_output("the arguments are not valid JSON")
    if not isinstance(arguments, dict):
        metrics.TOOL_CALLS.labels("bad_arguments").inc()
        return error_output("the arguments must be a JSON object")
    timeout_s = found.timeout_s if found.timeout_s is not None else limits.timeout_s
    started = time.perf_counter()
    try:
        async with asyncio.timeout(timeout_s):
            result = await _call(found.function, arguments, limits)
    except TimeoutError:
        metrics.TOOL_CALLS.labels("timeout").inc()
        return error_output(f"the tool did not answer within {timeout_s:g} s")
    except ToolsBusy as exc:
        metrics.TOOL_CALLS.labels("busy").inc()
        log.warning("tool %s not run: %s", call.name, exc)
        return error_output(f"the tool is not available now ({exc}); try again later")
    except ValidationError as exc:
        metrics.TOOL_CALLS.labels("bad_arguments").inc()
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'arguments'}: {e['msg']}" for e in exc.errors()
        )
        return error_output(f"invalid arguments: {problems}")
    except ToolError as exc:
        metrics.TOOL_CALLS.labels("error").inc()
        log.info("tool %s answered an error: %s", call.name, redact_urls(str(exc)))
        return error_output(clip(str(exc), limits.max_output_chars))
    except Exception as exc:
        metrics.TOOL_CALLS.labels("error").inc()
        log.warning("tool %s failed: %s", call.name, describe(exc, found.function))
        return error_output(f"the tool failed ({type(exc).__name__})")
    metrics.TOOL_SECONDS.observe(time.perf_counter() - started)
    metrics.TOOL_CALLS.labels("ok").inc()
    return clip(_text(result), limits.max_output_chars)


async def run_calls(
    tools: dict[str, Tool], calls: Sequence[ToolCall], limits: ToolLimits | float
) -> list[str]:
    """Outputs of several calls, run at once (the model asked for them together)."""
    limits = _resolved(limits)  # these calls count together against the per-session limit
    async with asyncio.TaskGroup() as group:
        runs = [group.create_task(run_call(tools, call, limits)) for call in calls]
    return [run.result() for run in runs]


def _resolved(limits: ToolLimits | float) -> ToolLimits:
    """Limits with an owner: the one given, else the session's, else these calls'."""
    if not isinstance(limits, ToolLimits):
        limits = ToolLimits(timeout_s=limits)
    if limits.owner is None:
        limits = dataclasses.replace(limits, owner=SESSION.get() or object())
    return limits


async def _call(function: Callable[..., Any], arguments: dict[str, Any], limits: ToolLimits) -> Any:
    if inspect.iscoroutinefunction(function) or inspect.iscoroutinefunction(
        getattr(function, "__wrapped__", None)
    ):
        awaitable: Awaitable[Any] = function(**arguments)
        return await awaitable
    pool = limits.pool or SHARED_POOL
    result = await pool.run(functools.partial(function, **arguments), limits.owner)
    if inspect.isawaitable(result):
        return await result
    return result


def _text(result: Any) -> str:
    if isinstance(result, str):
        return result
    try:
        return json.dumps(to_jsonable_python(result))
    except Exception:
        return str(result)


def describe(exc: BaseException, near: Callable[..., Any] | None = None) -> str:
    """An exception for the log: its type, its message with URLs redacted, and where it was
    raised: the innermost line in `near`'s file, else the innermost line (no traceback: its
    last line would repeat the message)."""
    frames = traceback.extract_tb(exc.__traceback__) if exc.__traceback__ else []
    code = getattr(inspect.unwrap(near), "__code__", None) if near is not None else None
    own = [f for f in frames if code is not None and f.filename == code.co_filename]
    where = (own or frames)[-1:]
    at = f" (at {where[0].filename}:{where[0].lineno})" if where else ""
    return f"{type(exc).__name__}: {redact_urls(str(exc))}{at}"
