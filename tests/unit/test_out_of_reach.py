"""Which Redis failures a job worker waits out (`out_of_reach`: the job stays pending) and
which it answers as failed: a refusal that passes by itself, or one a retry meets again."""

from __future__ import annotations

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import OutOfMemoryError, ResponseError

from services.common.bus.connection import out_of_reach


@pytest.mark.parametrize(
    ("exc", "passes"),
    [
        (RedisConnectionError("Connection refused"), True),
        # redis-py strips the OOM prefix: the class says it
        (OutOfMemoryError("command not allowed when used memory > 'maxmemory'."), True),
        (ResponseError("UNBLOCKED force unblock from blocking operation"), True),
        (
            ResponseError("Command # 1 (XADD) of pipeline caused error: ('NOGROUP No such key')"),
            True,
        ),
        (ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value"), False),
        (ValueError("not Redis at all"), False),
    ],
)
def test_what_passes_by_itself(exc: Exception, passes: bool) -> None:
    assert out_of_reach(exc) is passes
