"""Remote launch: a server someone else runs (`model-analyzer serve`, or a real Triton) in
explicit model-control mode, reached at its HTTP/gRPC endpoints and metrics URL.

Nothing is started, stopped or written on the server: each variant is loaded under the model's
own name with its config passed in the load request (the repository API's "config" parameter,
Triton's JSON form of the model config), measured, and unloaded. The model's files are the ones
in the server's repository. GPU numbers come from the server's metrics endpoint.

As MA's own client does, these calls go to the endpoint of `client_protocol` with the TLS of
perf_analyzer_flags' `ssl-*` keys: a server reached only over TLS (gRPC with
`ssl-grpc-use-ssl`, or HTTPS with an `https://` triton_http_endpoint) is controlled and measured
over TLS alike.
"""

from __future__ import annotations

import time

from google.protobuf import json_format

from analyzer.config.model_config import ModelConfig, parse_model_config
from analyzer.launch.base import (
    Launcher,
    LaunchError,
    LaunchSetupError,
    LoadTimeoutError,
    load_timeout_text,
)
from analyzer.loadgen.control import ControlClient, ServerError, ServerTimeout, control_client
from analyzer.tls import ClientTls


class RemoteLauncher(Launcher):
    remote = True

    def __init__(self, http_url: str, grpc_url: str, metrics_url: str,
                 startup_timeout_s: float = 120.0, protocol: str = "http",
                 tls: ClientTls | None = None,
                 headers: tuple[tuple[str, str], ...] = ()) -> None:  # fmt: skip
        self.http_url = _host_port(http_url, "triton_http_endpoint")
        self.grpc_url = _host_port(grpc_url, "triton_grpc_endpoint")
        self.metrics_url = metrics_url
        self.startup_timeout_s = startup_timeout_s
        self.protocol = protocol
        self.tls, self.headers = tls, headers
        self._ready = False

    @property
    def _endpoint(self) -> str:
        """The flag naming the endpoint the control calls use."""
        return f"triton_{self.protocol}_endpoint"

    def _control(self, timeout_s: float) -> ControlClient:
        url = self.grpc_url if self.protocol == "grpc" else self.http_url
        return control_client(self.protocol, url, "", headers=self.headers, tls=self.tls,
                              timeout=timeout_s)  # fmt: skip

    def _health(self, which: str) -> str:
        """'' when the server says it is `which`; else why not."""
        control = self._control(5.0)
        try:
            return control.server_health(which)
        finally:
            control.close()

    def start(self) -> None:
        """Wait for the server to be ready (it may still be starting)."""
        deadline = time.monotonic() + self.startup_timeout_s
        last = ""
        while time.monotonic() < deadline:
            last = self._health("ready")
            if not last:
                self._ready = True
                return
            time.sleep(0.5)
        url = self.grpc_url if self.protocol == "grpc" else self.http_url
        raise LaunchSetupError(
            f"no server ready at {self._endpoint} {url} after {self.startup_timeout_s:.0f} s "
            f"({last or 'no answer'}); start it in explicit model-control mode, or fix "
            f"--{self._endpoint.replace('_', '-')} (or the ssl-* keys of perf_analyzer_flags "
            "for a server reached over TLS)"
        )

    def stop(self) -> None:
        self._ready = False  # the server is not ours to stop

    def alive(self) -> bool:
        return self._ready and not self._health("live")

    def exit_status(self) -> str:
        return "" if self.alive() else f"the server at {self.http_url} stopped answering"

    def load_variant(self, name: str, config_text: str) -> None:
        """The server does not see our output repository: it loads its own copy of the model
        under the variant's config."""
        self.load_config(name, parse_model_config(config_text))

    def load_config(self, model: str, config: ModelConfig, timeout_s: float | None = None) -> None:
        """Load `model` from the server's repository with `config` instead of its own."""
        named = ModelConfig()
        named.CopyFrom(config)
        named.name = model
        config_json = json_format.MessageToJson(named)
        self._repository(lambda control: control.load_model(model, config_json),
                         self.load_wait_s() if timeout_s is None else timeout_s,
                         load_timeout_text(model, self.load_timeout_s))  # fmt: skip

    def unload(self, name: str, timeout_s: float = 120.0) -> None:
        self._repository(lambda control: control.unload_model(name), timeout_s)

    def _repository(self, call, timeout_s: float, timed_out: str = "") -> None:
        control = self._control(timeout_s)
        try:
            call(control)
        except ServerError as err:
            if timed_out and isinstance(err, ServerTimeout):
                raise LoadTimeoutError(timed_out) from None
            raise LaunchError(str(err)) from None
        finally:
            control.close()


def _host_port(url: str, field: str) -> str:
    """host:port from 'host:port' or 'http://host:port', 'https://host:port' kept as given (the
    load generator then speaks HTTPS, as perf_analyzer does); a clear error otherwise."""
    secure = url.startswith("https://")
    text = url.split("://", 1)[-1].rstrip("/")
    host, _, port = text.rpartition(":")
    if not host or not port.isascii() or not port.isdigit():
        raise LaunchSetupError(f"{field} '{url}' is not host:port")
    return f"https://{text}" if secure else text
