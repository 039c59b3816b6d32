"""ModelStreamInfer's answers: each message of a stream gets one response, in completion order.

A stream's messages take the unary call's fast lane: `InferenceService.submit_bytes` (a request laid
out like one seen before is served from its kept parse, its inputs numpy views of the message) and
`encode_parts` (the response head serialized once per layout). Each answer is a
ModelStreamInferResponse written as bytes -- field 2, `infer_response`, around the unary answer's
parts -- with no protobuf object, task or coroutine per request: the model's completion callback
puts it on the stream's queue through the loop.

A decoupled model's responses (any number per request, `on_response`) go out as they come, each
with `triton_final_response` saying whether it is the last; the request counts as answered when
the model sends its final flag.

Bounded as before: at most `grpc_max_stream_pending` requests of one stream are in the worker; the
next message is not taken (and its flow-control window not returned) until an answer is sent. An
error of one request (an unknown model, a bad input) is that request's answer (`error_message`),
and the stream goes on; a message that is not a ModelInferRequest ends the stream with
INVALID_ARGUMENT once the requests before it are answered; requests still in the worker when the
stream ends are cancelled.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from tritonclient.grpc import service_pb2 as pb

from analyzer.worker import offload
from analyzer.worker.errors import InferError
from analyzer.worker.grpc_layouts import varint
from analyzer.worker.grpc_messages import MalformedRequest, stream_error
from analyzer.worker.request import Outputs

if TYPE_CHECKING:
    from analyzer.worker.grpc import InferenceService
    from analyzer.worker.grpc_state import Inbox

_INFER_RESPONSE = b"\x12"  # ModelStreamInferResponse.infer_response: field 2, length-delimited
# perf_analyzer asks every request's response to say it is the last (non-decoupled models)
_FINAL_ASKED = "triton_enable_empty_final_response"
_FINAL = pb.ModelInferResponse(
    parameters={"triton_final_response": pb.InferParameter(bool_param=True)}
).SerializeToString()  # appended to a response, protobuf merges it into the map
_NOT_FINAL = pb.ModelInferResponse(
    parameters={"triton_final_response": pb.InferParameter(bool_param=False)}
).SerializeToString()


async def answer_stream(service: InferenceService, inbox: Inbox) -> AsyncIterator[list[bytes]]:
    """The serialized ModelStreamInferResponse of each request of `inbox`, as parts to join."""
    loop = asyncio.get_running_loop()
    # (the response's parts or None, whether it completes its request); None: the reader ended
    done: asyncio.Queue[tuple[list[bytes] | None, bool] | None] = asyncio.Queue()
    in_flight: dict[int, Any] = {}  # number -> the queued InferRequest, to cancel at the end
    room = asyncio.Semaphore(service.limits.grpc_max_stream_pending)
    reading, pending = True, 0  # the reader is taking messages; requests not yet answered

    # on the loop
    def finished(number: int, answer: list[Any], outputs: Outputs | None,
                 error: Exception | None, parts: list[bytes] | None = None) -> None:  # fmt: skip
        in_flight.pop(number, None)
        if parts is not None:  # encoded on the thread that finished it (offload.py)
            done.put_nowait((parts, True))
        elif answer[4] and error is None:  # decoupled: its responses went out as they came
            done.put_nowait((None, True))
        else:
            done.put_nowait((_response(service, answer, outputs, error), True))

    # on the loop
    def streamed(answer: list[Any], outputs: Outputs | None, error: Exception | None,
                 final: bool, parts: list[bytes] | None = None) -> None:  # fmt: skip
        if parts is None:
            parts = _decoupled_response(service, answer, outputs, error, final)
        if parts is not None:
            done.put_nowait((parts, False))

    async def read() -> None:
        nonlocal reading, pending
        number = 0
        try:
            while True:
                await room.acquire()
                try:
                    data = await anext(inbox)
                except StopAsyncIteration:
                    break
                number += 1
                # (model, fields, requested outputs, id, decoupled) once queued
                answer: list[Any] = []

                # on the model's thread; a large answer is encoded there (offload.py)
                def on_done(outputs: Outputs | None, error: Exception | None, number: int = number,
                            answer: list[Any] = answer) -> None:  # fmt: skip
                    if error is None and outputs is not None and len(answer) == 5 and (
                        not answer[4] and offload.heavy(outputs)
                    ):
                        parts = _response(service, answer, outputs, None)
                        loop.call_soon_threadsafe(finished, number, answer, None, None, parts)
                    else:
                        loop.call_soon_threadsafe(finished, number, answer, outputs, error)

                # on the model's thread
                def on_response(outputs: Outputs | None, error: Exception | None, final: bool,
                                answer: list[Any] = answer) -> None:  # fmt: skip
                    if error is None and outputs is not None and len(answer) == 5 and (
                        offload.heavy(outputs)
                    ):
                        parts = _decoupled_response(service, answer, outputs, None, final)
                        if parts is not None:
                            loop.call_soon_threadsafe(streamed, answer, None, None, final, parts)
                    else:
                        loop.call_soon_threadsafe(streamed, answer, outputs, error, final)

                pending += 1
                try:
                    submitted = service.submit_bytes(data, on_done, on_response)
                    model, fields, requested, request = submitted
                except MalformedRequest as err:
                    pending -= 1
                    inbox.fail(f"malformed ModelInferRequest in the stream: {err.detail}")
                    break
                except Exception as err:  # this request's answer; the stream goes on
                    done.put_nowait((_refused(data, err), True))
                    continue
                # `finished` runs on this loop, so only after this line: `answer` is complete
                decoupled = bool(getattr(model, "decoupled", False))
                answer += (model, fields, requested, request.id, decoupled)
                in_flight[number] = request
        finally:
            reading = False
            done.put_nowait(None)

    reader = asyncio.ensure_future(read())
    try:
        while reading or pending:
            item = await done.get()
            if item is None:
                continue
            parts, completes = item  # a decoupled model's responses do not complete a request
            if completes:
                pending -= 1
            if parts is not None:
                yield parts
            if completes:
                room.release()
    finally:
        # the client went away or the stream ended: its requests still queued are cancelled
        reader.cancel()
        for request in list(in_flight.values()):
            request.cancel()


def _decoupled_response(service: InferenceService, answer: list[Any], outputs: Outputs | None,
                        error: Exception | None, final: bool) -> list[bytes] | None:  # fmt: skip
    """One response of a decoupled model: its outputs with `triton_final_response` saying
    whether it is the last; a final flag sent alone is an empty response only when the client
    asked for one (`triton_enable_empty_final_response`), as Triton does."""
    model, fields, requested, request_id, _ = answer
    if error is None and outputs is None:
        asked = fields.parameters.get(_FINAL_ASKED)
        if not (final and asked is not None and asked.bool_param):
            return None
        empty = pb.ModelInferResponse(model_name=model.name, model_version=str(model.version),
                                      id=request_id).SerializeToString() + _FINAL  # fmt: skip
        return [_INFER_RESPONSE + varint(len(empty)), empty]
    if error is None:
        try:
            assert outputs is not None  # answered without error: outputs, or returned above
            parts = service.encode_parts(model, fields, outputs, requested, request_id)
        except InferError as err:
            error = err
        except Exception as err:
            error = InferError(f"model '{model.name}' returned outputs that cannot be sent: {err}")
    if error is not None:
        message = error.message if isinstance(error, InferError) else str(error)
        return [stream_error(request_id, fields.model_name, message).SerializeToString()]
    parts.append(_FINAL if final else _NOT_FINAL)
    size = sum(len(p) for p in parts)
    return [_INFER_RESPONSE + varint(size), *parts]


def _response(service: InferenceService, answer: list[Any], outputs: Outputs | None,
              error: Exception | None) -> list[bytes]:  # fmt: skip
    model, fields, requested, request_id, _ = answer
    if error is None:
        try:
            assert outputs is not None  # a request answered without error has outputs
            parts = service.encode_parts(model, fields, outputs, requested, request_id)
        except InferError as err:
            error = err
        except Exception as err:  # outputs no encoder understands: still an answer
            error = InferError(f"model '{model.name}' returned outputs that cannot be sent: {err}")
    if error is not None:
        message = error.message if isinstance(error, InferError) else str(error)
        return [stream_error(request_id, fields.model_name, message).SerializeToString()]
    final = fields.parameters.get(_FINAL_ASKED)
    if final is not None and final.bool_param:
        parts.append(_FINAL)
    size = sum(len(p) for p in parts)
    return [_INFER_RESPONSE + varint(size), *parts]


def _refused(data: bytes, error: Exception) -> list[bytes]:
    """The answer to a request refused before it was queued (it parsed: it has an id)."""
    if isinstance(error, InferError):
        message = error.message
    else:  # a bug must still answer, or the stream waits forever
        message = f"internal error: {type(error).__name__}: {error}"
    request = pb.ModelInferRequest.FromString(data)
    return [stream_error(request.id, request.model_name, message).SerializeToString()]
