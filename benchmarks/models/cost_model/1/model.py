"""A python-backend model whose cost follows a documented formula, for search benchmarks.

Executing a batch of n requests busy-waits FIXED_MS + PER_ITEM_MS * n of CPU time (a busy loop,
not a sleep, so instances compete for the machine's cores like real compute does). Hence:
- larger batches amortise the fixed cost: per-item cost = FIXED_MS / n + PER_ITEM_MS;
- instances help until they outnumber the cores, then only add contention;
- a queue delay helps when it lets batches fill, and only costs latency otherwise.
"""

import time

import numpy as np
import triton_python_backend_utils as pb_utils

FIXED_MS = 2.0
PER_ITEM_MS = 0.15


class TritonPythonModel:
    def execute(self, requests):
        rows = sum(pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy().shape[0]
                   for r in requests)
        end = time.perf_counter() + (FIXED_MS + PER_ITEM_MS * rows) / 1000.0
        while time.perf_counter() < end:
            pass
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            out = pb_utils.Tensor("OUTPUT0", (x * 2).astype(np.float32))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses
