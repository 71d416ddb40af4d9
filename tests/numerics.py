"""How tests compare results computed at different shapes: a logit tolerance derived from the dtype a
route rounds its sums to, the top-two margin that says where a greedy choice is decided beyond that
tolerance, and the checks built from them (docs/reliability.md, "What is bit-exact").

Two results of one row at the same shapes are compared bit for bit; at different shapes (another row
count, key width or batch) the CPU's kernels block the sums differently, so they agree within
`logit_tolerance` and their greedy tokens agree wherever the top two logits differ by more than twice it."""

from __future__ import annotations

import math

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# Units in the last place (of the dtype, at the logits' magnitude) a logit may move when its sums are taken
# in another order. float32: 64, for the reordered sums of every layer (measured worst, the bundled model
# batched against alone on AVX-512 and on AVX2 kernels, one and two threads: a top-two gap moved by 3.6e-5,
# under 10 units). bfloat16: 1, since int4 and int8 decode matmuls round their float32 inputs to bfloat16 and
# a last-bit change upstream can move such an input by a whole unit (measured worst: a top-two gap moved by
# 0.22 logits, int4 batched against alone and against float32, where one unit at 32 is 0.25).
ULPS = {torch.float32: 64, torch.bfloat16: 1}
# The dtype whose rounding a route's decode sums go through (quantize.MM_DTYPE for int4 and int8).
ROUTE_ROUNDING = {"float32": torch.float32, "int4": torch.bfloat16, "int8": torch.bfloat16}
# Above the bundled model's largest logit (45.5, measured over the 24 quality prompts and their answers; tests/model
# checks it) and below 64, where the spacing of float32's and bfloat16's values doubles.
BUNDLED_LOGIT_MAGNITUDE = 60.0


def ulp(dtype: torch.dtype, magnitude: float) -> float:
    """The spacing of `dtype`'s values at `magnitude` (one unit in the last place there)."""
    return torch.finfo(dtype).eps * 2.0 ** math.floor(math.log2(max(1.0, magnitude)))


def logit_tolerance(dtype: torch.dtype, magnitude: float) -> float:
    """The most a logit of at most `magnitude` may move between two shapes when its sums are rounded in `dtype`."""
    return ULPS[dtype] * ulp(dtype, magnitude)


def route_tolerance(route: str) -> float:
    """logit_tolerance for the bundled model on a --dtype route (its `dtype_route`: float32, int4, int8)."""
    return logit_tolerance(ROUTE_ROUNDING[route], BUNDLED_LOGIT_MAGNITUDE)


def decided_margin(tolerance: float) -> float:
    """The top-two gap above which a greedy choice cannot flip: each of the two logits moves by `tolerance`
    at most, so their gap by twice it."""
    return 2 * tolerance


def top_two_margin(logits: torch.Tensor) -> torch.Tensor:
    """[..., vocab] → [...]: the largest logit minus the second (how far the greedy choice is from a tie)."""
    top = logits.float().topk(2, dim=-1).values
    return top[..., 0] - top[..., 1]


def assert_within_rounding(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype = torch.float32) -> float:
    """got ≈ want within logit_tolerance at want's magnitude, and greedy tokens equal wherever want's top two
    are further apart than decided_margin; returns the tolerance used."""
    tolerance = logit_tolerance(dtype, float(want.abs().max()))
    torch.testing.assert_close(got, want, rtol=0, atol=tolerance)
    decided = top_two_margin(want) > decided_margin(tolerance)
    assert decided.any(), "no row's choice is decided beyond the tolerance: the comparison says nothing"
    assert torch.equal(got.argmax(-1)[decided], want.argmax(-1)[decided])
    return tolerance


def event_margin(choice: dict) -> float:
    """A token event's (or prefill_end's first_token's) top-two gap in logits, from its candidates'
    probabilities: greedy probabilities are a softmax at temperature 1, so log p1 − log p2 is the gap."""
    first, second = (c["prob"] for c in choice["candidates"][:2])
    return math.inf if second <= 0 else math.log(first) - math.log(second)


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first index where two token lists differ (a length difference counts), None when equal."""
    index = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return None if index == len(a) == len(b) else index


def assert_same_choices(got: list[dict], want: list[dict], tolerance: float) -> None:
    """Token events' choices (a token event, or prefill_end's first_token) from two runs at different shapes:
    each chosen token, and each candidate rank apart from its neighbours by more than decided_margin (the
    last shown rank's neighbour is not shown, so it is never decided), are equal; probabilities within
    twice `tolerance` (a softmax moves by at most p · 2 · tolerance when each logit moves by `tolerance`)."""
    margin = decided_margin(tolerance)
    assert len(got) == len(want)
    for index, (a, b) in enumerate(zip(got, want)):
        assert event_margin(b) > margin, f"choice {index} is a near-tie ({event_margin(b):.3g}): pick other prompts"
        assert a["id"] == b["id"], f"choice {index}: {a['id']} for {b['id']}, decided by {event_margin(b):.3g}"
        logs = [math.log(c["prob"]) if c["prob"] > 0 else -math.inf for c in b["candidates"]]
        for rank in range(len(logs) - 1):
            apart = logs[rank] - logs[rank + 1] > margin and (rank == 0 or logs[rank - 1] - logs[rank] > margin)
            if apart:
                assert a["candidates"][rank]["id"] == b["candidates"][rank]["id"], f"choice {index}, rank {rank}"
        probs = torch.tensor([a["prob"]] + [c["prob"] for c in a["candidates"]])
        expected = torch.tensor([b["prob"]] + [c["prob"] for c in b["candidates"]])
        torch.testing.assert_close(probs, expected, rtol=0, atol=2 * tolerance)


class CountCalls(TorchDispatchMode):
    """Counts this thread's calls of one aten op (a kernel) while active: `with CountCalls(op) as counted:`."""

    def __init__(self, op):
        super().__init__()
        self.op, self.calls = op, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls += func is self.op
        return func(*args, **(kwargs or {}))
