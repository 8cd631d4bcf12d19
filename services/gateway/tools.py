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
the reply goes on: a tool never ends a session. Async tools are cancelled with their
reply (barge-in); a plain function runs in a worker thread, where a cancelled one runs
to its end and its result is dropped.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, overload

from pydantic import TypeAdapter, ValidationError, validate_call
from pydantic_core import to_jsonable_python

from services.gateway import metrics
from services.gateway.agent import ToolCall

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 10.0


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


def error_output(message: str) -> str:
    """A tool result that tells the model what went wrong."""
    return json.dumps({"error": message})


async def run_call(tools: dict[str, Tool], call: ToolCall, default_timeout_s: float) -> str:
    """The output of one call, as text for the model; never raises but for cancellation."""
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
    timeout_s = found.timeout_s if found.timeout_s is not None else default_timeout_s
    started = time.perf_counter()
    try:
        async with asyncio.timeout(timeout_s):
            result = await _call(found.function, arguments)
    except TimeoutError:
        metrics.TOOL_CALLS.labels("timeout").inc()
        return error_output(f"the tool did not answer within {timeout_s:g} s")
    except ValidationError as exc:
        metrics.TOOL_CALLS.labels("bad_arguments").inc()
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'arguments'}: {e['msg']}" for e in exc.errors()
        )
        return error_output(f"invalid arguments: {problems}")
    except Exception as exc:
        metrics.TOOL_CALLS.labels("error").inc()
        log.warning("tool %s failed: %s", call.name, exc)
        return error_output(f"the tool failed: {exc}")
    metrics.TOOL_SECONDS.observe(time.perf_counter() - started)
    metrics.TOOL_CALLS.labels("ok").inc()
    return _text(result)


async def run_calls(
    tools: dict[str, Tool], calls: Sequence[ToolCall], timeout_s: float
) -> list[str]:
    """Outputs of several calls, run at once (the model asked for them together)."""
    async with asyncio.TaskGroup() as group:
        runs = [group.create_task(run_call(tools, call, timeout_s)) for call in calls]
    return [run.result() for run in runs]


async def _call(function: Callable[..., Any], arguments: dict[str, Any]) -> Any:
    if inspect.iscoroutinefunction(function) or inspect.iscoroutinefunction(
        getattr(function, "__wrapped__", None)
    ):
        awaitable: Awaitable[Any] = function(**arguments)
        return await awaitable
    result = await asyncio.to_thread(function, **arguments)
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
