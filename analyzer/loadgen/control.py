"""Control-plane calls to a KServe v2 server: metadata, config and statistics.

Two transports behind one interface, both returning the HTTP API's JSON shapes, so the rest of the
load generator never cares which protocol it drives. These calls are few (before and after each
measurement), so plain blocking clients are right here; the hot path lives in the shards.
"""

from __future__ import annotations

import http.client
import json
from abc import ABC, abstractmethod
from typing import Any
from urllib.parse import quote

from analyzer.tls import ClientTls


class ServerError(RuntimeError):
    """The server could not be reached or refused a control call; the message says which."""


class ServerTimeout(ServerError):
    """A control call got no answer within the client's timeout."""


def split_url(url: str, default_port: int) -> tuple[str, int]:
    """'host:port' or 'http://host:port' -> (host, port)."""
    rest = url.split("://", 1)[-1].rstrip("/")
    host, sep, port = rest.rpartition(":")
    if not sep:
        return rest, default_port
    try:
        return host.strip("[]"), int(port)
    except ValueError:
        raise ServerError(f"-u {url}: the port '{port}' is not a number") from None


class ControlClient(ABC):
    """Blocking metadata/config/statistics calls; all answers use the HTTP API's JSON shapes."""

    def __init__(self, url: str, model: str, version: str = "",
                 headers: tuple[tuple[str, str], ...] = ()):  # fmt: skip
        self.url, self.model, self.version = url, model, version
        self.headers = headers  # -H: sent with every call, as with the inference requests

    @abstractmethod
    def server_metadata(self) -> dict[str, Any]: ...

    @abstractmethod
    def model_metadata(self) -> dict[str, Any]: ...

    @abstractmethod
    def model_config(self) -> dict[str, Any]: ...

    @abstractmethod
    def model_stats(self, every_model: bool = False) -> dict[str, Any]:
        """The model's statistics; `every_model`: every model's (an ensemble's steps too)."""

    @abstractmethod
    def register_system_shm(self, name: str, key: str, byte_size: int) -> None:
        """Register POSIX shm object `key` (offset 0, `byte_size` bytes) as region `name`."""

    @abstractmethod
    def unregister_system_shm(self, name: str) -> None: ...

    @abstractmethod
    def server_health(self, which: str) -> str:
        """'' when the server answers that it is `which` ("ready" or "live"), else why not."""

    @abstractmethod
    def load_model(self, name: str, config_json: str = "") -> None:
        """The repository API's load, with Triton's JSON model config in place of the
        server's own when `config_json` is given."""

    @abstractmethod
    def unload_model(self, name: str) -> None:
        """The repository API's unload, with its dependents (an ensemble's composing models)."""

    def close(self) -> None:  # noqa: B027 - most transports hold nothing to release
        """Release connections."""


class HttpControl(ControlClient):
    def __init__(self, url: str, model: str, version: str = "", headers=(), timeout=30.0,
                 tls: ClientTls | None = None):  # fmt: skip
        super().__init__(url, model, version, headers)
        self.host, self.port = split_url(url, 8000)
        if url.startswith("https://"):
            context = (tls or ClientTls()).context("http")
            self._conn: http.client.HTTPConnection = http.client.HTTPSConnection(
                self.host, self.port, timeout=timeout, context=context)
        else:
            self._conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)

    def _model_path(self) -> str:
        base = f"/v2/models/{quote(self.model, safe='')}"
        return f"{base}/versions/{self.version}" if self.version else base

    def _get(self, path: str, body: dict | None = None) -> dict[str, Any]:
        method = "GET" if body is None else "POST"
        data = None if body is None else json.dumps(body).encode()
        for attempt in (0, 1):
            try:
                self._conn.request(method, path, body=data, headers=dict(self.headers))
                response = self._conn.getresponse()
                body = response.read()
                break
            except (http.client.HTTPException, ConnectionResetError, BrokenPipeError) as exc:
                self._conn.close()  # a dropped keep-alive connection: one retry on a fresh one
                if attempt:
                    raise ServerError(f"{method} {path} on {self.url} failed: {exc}") from None
            except TimeoutError:
                self._conn.close()
                raise ServerTimeout(f"{method} {path} on {self.url}: no answer within "
                                    f"{self._conn.timeout:g} s") from None  # fmt: skip
            except OSError as exc:
                self._conn.close()
                raise ServerError(
                    f"cannot reach the server at {self.url} over HTTP: {exc.strerror or exc}"
                ) from None
        try:
            data = json.loads(body) if body else {}
        except json.JSONDecodeError:
            raise ServerError(f"{method} {path} on {self.url} did not answer JSON") from None
        if response.status != 200:
            message = data.get("error", body.decode(errors="replace")) if data else response.reason
            raise ServerError(f"{method} {path} on {self.url}: {message}")
        return data

    def server_metadata(self) -> dict[str, Any]:
        return self._get("/v2")

    def model_metadata(self) -> dict[str, Any]:
        return self._get(self._model_path())

    def model_config(self) -> dict[str, Any]:
        return self._get(self._model_path() + "/config")

    def model_stats(self, every_model: bool = False) -> dict[str, Any]:
        return self._get("/v2/models/stats" if every_model else self._model_path() + "/stats")

    def register_system_shm(self, name: str, key: str, byte_size: int) -> None:
        self._get(f"/v2/systemsharedmemory/region/{name}/register",
                  {"key": key, "offset": 0, "byte_size": byte_size})  # fmt: skip

    def unregister_system_shm(self, name: str) -> None:
        self._get(f"/v2/systemsharedmemory/region/{name}/unregister", {})

    def server_health(self, which: str) -> str:
        try:
            self._get(f"/v2/health/{which}")
        except ServerError as err:
            return str(err)
        return ""

    def load_model(self, name: str, config_json: str = "") -> None:
        body = {"parameters": {"config": config_json}} if config_json else {}
        self._get(f"/v2/repository/models/{quote(name, safe='')}/load", body)

    def unload_model(self, name: str) -> None:
        self._get(f"/v2/repository/models/{quote(name, safe='')}/unload",
                  {"parameters": {"unload_dependents": True}})  # fmt: skip

    def close(self) -> None:
        self._conn.close()


class GrpcControl(ControlClient):
    def __init__(self, url: str, model: str, version: str = "", headers=(), timeout=30.0,
                 tls: ClientTls | None = None):  # fmt: skip
        import grpc
        from tritonclient.grpc import service_pb2_grpc

        super().__init__(url, model, version, headers)
        self._metadata = tuple((name.lower(), value) for name, value in headers)
        host, port = split_url(url, 8001)
        self._grpc = grpc
        target = f"{host}:{port}"
        self._channel = (grpc.secure_channel(target, tls.grpc_credentials())
                         if tls is not None and tls.grpc else grpc.insecure_channel(target))
        self._stub = service_pb2_grpc.GRPCInferenceServiceStub(self._channel)
        self._timeout = timeout

    def _call(self, method: str, request) -> Any:
        try:
            return getattr(self._stub, method)(request, timeout=self._timeout,
                                               metadata=self._metadata)  # fmt: skip
        except self._grpc.RpcError as exc:
            code = exc.code()
            if code == self._grpc.StatusCode.DEADLINE_EXCEEDED:
                raise ServerTimeout(f"{method} on {self.url}: no answer within "
                                    f"{self._timeout:g} s") from None  # fmt: skip
            if code == self._grpc.StatusCode.UNAVAILABLE:
                raise ServerError(f"cannot reach the server at {self.url} over gRPC") from None
            raise ServerError(f"{method} on {self.url}: {exc.details()}") from None

    def server_metadata(self) -> dict[str, Any]:
        from tritonclient.grpc import service_pb2

        from analyzer.config.model_config import proto_to_dict

        return proto_to_dict(self._call("ServerMetadata", service_pb2.ServerMetadataRequest()))

    def model_metadata(self) -> dict[str, Any]:
        from tritonclient.grpc import service_pb2

        from analyzer.config.model_config import proto_to_dict

        request = service_pb2.ModelMetadataRequest(name=self.model, version=self.version)
        return proto_to_dict(self._call("ModelMetadata", request))

    def model_config(self) -> dict[str, Any]:
        from tritonclient.grpc import service_pb2

        from analyzer.config.model_config import model_config_to_dict

        request = service_pb2.ModelConfigRequest(name=self.model, version=self.version)
        return model_config_to_dict(self._call("ModelConfig", request).config)

    def model_stats(self, every_model: bool = False) -> dict[str, Any]:
        from tritonclient.grpc import service_pb2

        from analyzer.config.model_config import proto_to_dict

        request = service_pb2.ModelStatisticsRequest()
        if not every_model:
            request = service_pb2.ModelStatisticsRequest(name=self.model, version=self.version)
        return proto_to_dict(self._call("ModelStatistics", request))

    def register_system_shm(self, name: str, key: str, byte_size: int) -> None:
        from tritonclient.grpc import service_pb2

        self._call("SystemSharedMemoryRegister", service_pb2.SystemSharedMemoryRegisterRequest(
            name=name, key=key, offset=0, byte_size=byte_size))  # fmt: skip

    def unregister_system_shm(self, name: str) -> None:
        from tritonclient.grpc import service_pb2

        self._call("SystemSharedMemoryUnregister",
                   service_pb2.SystemSharedMemoryUnregisterRequest(name=name))  # fmt: skip

    def server_health(self, which: str) -> str:
        from tritonclient.grpc import service_pb2

        method = "ServerReady" if which == "ready" else "ServerLive"
        try:
            answer = self._call(method, getattr(service_pb2, f"{method}Request")())
        except ServerError as err:
            return str(err)
        return "" if getattr(answer, which) else f"{method} on {self.url} answered false"

    def load_model(self, name: str, config_json: str = "") -> None:
        from tritonclient.grpc import service_pb2

        request = service_pb2.RepositoryModelLoadRequest(model_name=name)
        if config_json:
            request.parameters["config"].string_param = config_json
        self._call("RepositoryModelLoad", request)

    def unload_model(self, name: str) -> None:
        from tritonclient.grpc import service_pb2

        request = service_pb2.RepositoryModelUnloadRequest(model_name=name)
        request.parameters["unload_dependents"].bool_param = True
        self._call("RepositoryModelUnload", request)

    def close(self) -> None:
        self._channel.close()


def control_client(
    protocol: str, url: str, model: str, version: str = "", headers=(),
    tls: ClientTls | None = None, timeout: float = 30.0,
) -> ControlClient:  # fmt: skip
    if protocol == "http":
        return HttpControl(url, model, version, headers, timeout, tls=tls)
    if protocol == "grpc":
        return GrpcControl(url, model, version, headers, timeout, tls=tls)
    raise ServerError(f"-i {protocol}: the protocol must be http or grpc")

