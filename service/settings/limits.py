"""What one request may ask and when it is let in: the input limits (422 past them), the budgets of work, memory
and answer size (413 past them; the cost model's calibration prices the work), which requests run on the event
loop, and admission to the compute slots (503 when it is refused).
"""

from __future__ import annotations

from pydantic import BaseModel, Field, field_validator


class LimitSettings(BaseModel):
    """The input limits and the budgets of one request."""

    # Input limits (422 past them)
    max_rank: int = Field(4, ge=2, le=4, description="Largest tensor rank accepted (2 to 4).")
    max_dim: int = Field(16384, ge=1, description="Largest size of any one tensor dimension.")
    max_tensor_elements: int = Field(1 << 24, ge=1, description="Largest element count of any one input tensor.")
    max_vocab: int = Field(
        1 << 20,
        ge=1,
        description="Largest size of any axis of /v1/sample and /v1/calibrate logits (vocabulary, classes, rows).",
    )

    # Budgets (413 past them, checked before anything large is allocated)
    max_work_flops: float = Field(
        2e11,
        gt=0,
        description="Largest estimated work of one request, in float32 GEMM-equivalent operations: its estimated "
        "single-core time on the reference machine times 50 GFLOP/s (2e11 is about 4 core-seconds; see "
        "service/engines/cost.py), scaled to this machine by ATTN_COST_CALIBRATION.",
    )
    memory_budget_bytes: int = Field(
        1 << 30,
        ge=1 << 20,
        description="Estimated memory of the requests computed at once by one worker process (inputs, engine "
        "intermediates, results and response). A request whose own estimate exceeds it is refused (413); others wait "
        "for room up to ATTN_QUEUE_TIMEOUT_S (then 503). Request bodies count too, from admission "
        "(ATTN_BODY_MEMORY_BYTES).",
    )
    body_memory_bytes: int = Field(
        0,
        ge=0,
        description="How much of ATTN_MEMORY_BUDGET_BYTES request bodies may hold: each admitted request reserves "
        "its declared length (a streamed body, what arrives; a gzip body, what it inflates to; a gRPC message, its "
        "size) until it ends, and is refused 503 with Retry-After (gRPC: UNAVAILABLE) while the budget's "
        "reservations would pass this; the rest of the budget stays for the work in progress. REST bodies and gRPC "
        "messages share it. "
        "0: half the budget, at least ATTN_MAX_BODY_BYTES.",
    )
    cost_calibration: str = Field(
        "auto",
        description="How the cost model fits this machine: 'auto' (serve times the kernels at start, before it "
        "listens, and scales the model where this machine is slower than the reference), 'off' (the reference's "
        "constants), or factors such as 'gemm=1,sparsemax=1.7,entmax15=1.6' (a kernel not named keeps 1).",
    )
    max_response_bytes: int = Field(
        256 << 20, ge=1024, description="Largest estimated size of one response body, in bytes."
    )

    @field_validator("cost_calibration")
    @classmethod
    def _calibration(cls, value: str) -> str:
        """'auto', 'off', or kernel=factor pairs that the cost model takes."""
        text = value.strip()
        if text.lower() in ("auto", "off"):
            return text.lower()
        from service.engines.cost_calibration import parse_factors

        parse_factors(text)  # ValueError names what is wrong
        return text

    def cost_factors(self) -> dict[str, float] | None:
        """The calibration factors given explicitly (None for 'auto' and 'off')."""
        if self.cost_calibration in ("auto", "off"):
            return None
        from service.engines.cost_calibration import parse_factors

        return parse_factors(self.cost_calibration)


class InlineSettings(BaseModel):
    """Which requests run on the event loop rather than in the thread pool."""

    inline_max_body_bytes: int = Field(
        2048,
        ge=0,
        description="Only requests with a body this small may run on the event loop (and then only when their "
        "estimated work is under ATTN_INLINE_MAX_WORK_FLOPS); the others run in the thread pool.",
    )
    inline_max_work_flops: float = Field(
        1e7,
        ge=0,
        description="Largest estimated work (GEMM-equivalent operations, as ATTN_MAX_WORK_FLOPS; 1e7 is about "
        "0.2 ms of one core) computed on the event loop: cheaper than a thread hop. Costlier requests run in the "
        "thread pool.",
    )


class AdmissionSettings(BaseModel):
    """A request's size and time on the wire, the compute slots and the queue before them."""

    max_body_bytes: int = Field(
        32 << 20, ge=1024, description="Largest request body on the wire, in bytes (413 before it is read in full)."
    )
    request_timeout_s: float = Field(
        30.0, gt=0, le=3600, description="Time limit of one request, queue wait included (504 at the deadline)."
    )
    max_concurrent_requests: int = Field(
        2,
        ge=1,
        le=1024,
        description="Compute slots per worker process: requests doing CPU work at once (uploads hold none). Each "
        "request's engine already uses every core, so about one slot per core is best: more slots only make the "
        "threads contend for the interpreter and the cores (measured: 2 slots gave 1.2x the goodput of 8 on 2 cores).",
    )
    max_queued_requests: int = Field(
        256,
        ge=0,
        le=4096,
        description="Admitted requests that may wait for a compute slot; past it, 503 with Retry-After at once.",
    )
    queue_target_s: float = Field(
        5.0,
        gt=0,
        description="Admission target: a request is admitted while its expected wait for a compute slot "
        "(requests ahead x recent service time per slot) stays under this (and under ATTN_QUEUE_TIMEOUT_S); "
        "else 503 before its body is read.",
    )
    queue_timeout_s: float = Field(
        10.0, gt=0, description="Longest wait of an admitted request for a compute slot before a 503 with Retry-After."
    )
    retry_after_s: int = Field(
        1, ge=1, le=3600, description="Smallest Retry-After (seconds) of 503 overload answers (else the expected wait)."
    )
