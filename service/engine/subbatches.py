"""How a batch is cut into model runs (split_runs, what a run costs) and softmax.

Pure numpy and Python (no onnxruntime, no tokenizers): inference.TextRunner, the benchmark's
in-process ceilings and the tests use them. Padding is textserve.tokenization's, the one
tokenization.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

# What one more onnxruntime run costs, in padded tokens: split_runs weighs each sub-batch at
# this. On CPU a run costs about 0.15 ms in onnxruntime (the small preset, one thread: 10-20
# tokens' worth at 10-15 us a token) plus the Python around it and taking the GIL back from the
# event loop afterwards. Served at 128 callers, 32 and 64 gave about the same CPU per text and
# 16 more (smaller runs). On a GPU a run's fixed cost dwarfs a token's: batches stay whole.
RUN_COST_TOKENS = {"CPUExecutionProvider": 32}
RUN_COST_TOKENS_OTHER = 1 << 30


def softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise softmax in float32, stable for large logits."""
    shifted = logits - logits.max(axis=1, keepdims=True)
    np.exp(shifted, out=shifted)
    shifted /= shifted.sum(axis=1, keepdims=True)
    return shifted


def split_runs(lengths: Sequence[int], run_cost: int) -> list[int]:
    """Where to split lengths sorted in ascending order into sub-batches, each padded to its own
    longest: the start index of each sub-batch after the first. Minimises the padded tokens plus
    `run_cost` per sub-batch (dynamic programming over the distinct lengths: at most max_length
    of them, ~75 us for 64 texts).

    >>> split_runs([3, 4, 5, 20, 21, 22], run_cost=16)
    [3]
    >>> split_runs([3, 4, 5, 20, 21, 22], run_cost=100)
    []
    """
    if not lengths:
        return []
    starts = [0]  # start index of each group of equal lengths
    for index in range(1, len(lengths)):
        if lengths[index] != lengths[index - 1]:
            starts.append(index)
    groups = len(starts)
    ends = [*starts[1:], len(lengths)]
    # best[j]: least cost of the first j groups; back[j]: the group its last sub-batch starts at
    best = [0] * (groups + 1)
    back = [0] * (groups + 1)
    for j in range(1, groups + 1):
        width, end = lengths[ends[j - 1] - 1], ends[j - 1]
        cost, start = min((best[i] + (end - starts[i]) * width, i) for i in range(j))
        best[j], back[j] = cost + run_cost, start
    cuts: list[int] = []
    j = groups
    while j > 0 and back[j] > 0:
        cuts.append(starts[back[j]])
        j = back[j]
    cuts.reverse()
    return cuts
