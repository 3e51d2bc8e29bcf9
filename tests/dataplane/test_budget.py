"""The work, response and memory limits without a server (issue 29 item 5): each refusal names the limit it
passed and what would help.
"""

from __future__ import annotations

import pytest

from service.core.attention import Dims
from service.dataplane import budget
from service.dataplane.errors import Kind, ServiceError

LIMITS = budget.Budget(max_work_flops=1e9, max_response_bytes=1 << 20, max_memory_bytes=64 << 20)


def test_within_every_limit_is_no_refusal() -> None:
    assert budget.check(LIMITS, 1e8, 1000, 1 << 20) is None
    budget.enforce(LIMITS, 1e8, 1000)


@pytest.mark.parametrize(
    ("flops", "response", "memory", "says"),
    [
        (2e9, 0, None, "exceeds the limit of 1e+09; split the request"),
        (0.0, 2 << 20, None, "estimated response size 2097152 bytes exceeds the limit of 1048576"),
        (0.0, 0, 128 << 20, "estimated memory 128.0 MiB exceeds this server's budget of 64.0 MiB"),
    ],
)
def test_each_limit_refuses_naming_itself(flops: float, response: int, memory: int | None, says: str) -> None:
    reason = budget.check(LIMITS, flops, response, memory)
    assert reason is not None and says in reason
    with pytest.raises(ServiceError) as err:
        budget.enforce(LIMITS, flops, response, memory)
    assert err.value.kind is Kind.TOO_LARGE and err.value.message == reason


def test_a_json_answer_is_priced_above_a_binary_one() -> None:
    dims = Dims(B=1, Hq=8, Hkv=8, L=128, S=128, E=64, Ev=64)
    returned = ("output", "weights")
    json32 = budget.attention_response_bytes(dims, returned, "float32", "json")
    binary32 = budget.attention_response_bytes(dims, returned, "float32", "binary")
    numbers = 8 * 128 * (64 + 128)
    assert binary32 >= numbers * 4 and json32 >= numbers * 16 > binary32
    assert budget.attention_response_bytes(dims, returned, "float64", "json") > json32
