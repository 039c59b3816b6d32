"""Errors a client can cause, with the HTTP status and gRPC code Triton answers them with."""

from __future__ import annotations

from enum import Enum

import grpc


class Status(Enum):
    INVALID_ARG = (400, grpc.StatusCode.INVALID_ARGUMENT)
    NOT_FOUND = (404, grpc.StatusCode.NOT_FOUND)
    UNAVAILABLE = (503, grpc.StatusCode.UNAVAILABLE)
    UNSUPPORTED = (501, grpc.StatusCode.UNIMPLEMENTED)  # Triton's HttpCodeFromError
    ALREADY_EXISTS = (400, grpc.StatusCode.ALREADY_EXISTS)
    INTERNAL = (500, grpc.StatusCode.INTERNAL)
    # what a python model may answer with (pb_utils.TritonError's codes), as Triton maps them
    UNKNOWN = (400, grpc.StatusCode.UNKNOWN)
    CANCELLED = (400, grpc.StatusCode.CANCELLED)

    @property
    def http(self) -> int:
        return self.value[0]

    @property
    def grpc(self) -> grpc.StatusCode:
        return self.value[1]


class InferError(Exception):
    """Raised anywhere on the request path; the protocol layer answers in Triton's error shape."""

    def __init__(self, message: str, status: Status = Status.INVALID_ARG):
        super().__init__(message)
        self.message = message
        self.status = status

    def __str__(self) -> str:
        return self.message
