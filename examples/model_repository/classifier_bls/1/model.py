"""The `classifier` ensemble as Business Logic Scripting: the images of each request are
normalized here, then classified by tiny_cnn through the server
(`pb_utils.InferenceRequest(...).async_exec()`, the requests of a batch side by side)."""

import asyncio

import numpy as np
import triton_python_backend_utils as pb_utils

MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32).reshape(1, 3, 1, 1)
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32).reshape(1, 3, 1, 1)


class TritonPythonModel:
    async def execute(self, requests):
        calls = []
        for request in requests:
            images = pb_utils.get_input_tensor_by_name(request, "IMAGE").as_numpy()
            pixels = (images.astype(np.float32).transpose(0, 3, 1, 2) / 255.0 - MEAN) / STD
            calls.append(pb_utils.InferenceRequest(
                model_name="tiny_cnn", inputs=[pb_utils.Tensor("INPUT__0", pixels)],
                requested_output_names=["OUTPUT__0"]).async_exec())
        responses = []
        for answer in await asyncio.gather(*calls):
            if answer.has_error():
                responses.append(pb_utils.InferenceResponse(error=answer.error()))
                continue
            scores = pb_utils.get_output_tensor_by_name(answer, "OUTPUT__0").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("SCORES", scores)]))
        return responses
