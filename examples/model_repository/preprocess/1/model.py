"""Preprocessing for tiny_cnn: 8-bit HWC images to normalized float CHW tensors, one batch at a
time (the dynamic batcher gathers the requests)."""

import numpy as np
import triton_python_backend_utils as pb_utils

MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32).reshape(1, 3, 1, 1)
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32).reshape(1, 3, 1, 1)


def normalize(images: np.ndarray) -> np.ndarray:
    """(N, 32, 32, 3) uint8 -> (N, 3, 32, 32) float32, as the model was trained to see them."""
    chw = images.astype(np.float32).transpose(0, 3, 1, 2) / 255.0
    return (chw - MEAN) / STD


class TritonPythonModel:
    def execute(self, requests):
        images = [pb_utils.get_input_tensor_by_name(r, "IMAGE").as_numpy() for r in requests]
        pixels = normalize(np.concatenate(images))
        responses, start = [], 0
        for image in images:
            part = pixels[start : start + len(image)]
            start += len(image)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("PIXELS", part)]))
        return responses
