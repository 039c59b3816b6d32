"""Remote launch: a server someone else runs (`model-analyzer serve`, or a real Triton) in
explicit model-control mode, reached at its HTTP/gRPC endpoints and metrics URL.

Nothing is started, stopped or written on the server: each variant is loaded under the model's
own name with its config passed in the load request (the repository API's "config" parameter,
Triton's JSON form of the model config), measured, and unloaded. The model's files are the ones
in the server's repository. GPU numbers come from the server's metrics endpoint.
"""

from __future__ import annotations

import http.client
import time

from google.protobuf import json_format

from analyzer.config.model_config import ModelConfig, parse_model_config
from analyzer.launch.base import Launcher, LaunchSetupError


class RemoteLauncher(Launcher):
    remote = True

    def __init__(self, http_url: str, grpc_url: str, metrics_url: str,
                 startup_timeout_s: float = 120.0) -> None:  # fmt: skip
        self.http_url = _host_port(http_url, "triton_http_endpoint")
        self.grpc_url = _host_port(grpc_url, "triton_grpc_endpoint")
        self.metrics_url = metrics_url
        self.startup_timeout_s = startup_timeout_s
        self._ready = False

    def start(self) -> None:
        """Wait for the server to be ready (it may still be starting)."""
        deadline = time.monotonic() + self.startup_timeout_s
        last = ""
        while time.monotonic() < deadline:
            status, last = self._get("/v2/health/ready")
            if status == 200:
                self._ready = True
                return
            time.sleep(0.5)
        raise LaunchSetupError(
            f"no server ready at triton_http_endpoint {self.http_url} after "
            f"{self.startup_timeout_s:.0f} s ({last or 'no answer'}); start it in explicit "
            "model-control mode, or fix --triton-http-endpoint"
        )

    def stop(self) -> None:
        self._ready = False  # the server is not ours to stop

    def alive(self) -> bool:
        return self._ready and self._get("/v2/health/live")[0] == 200

    def exit_status(self) -> str:
        return "" if self.alive() else f"the server at {self.http_url} stopped answering"

    def load_variant(self, name: str, config_text: str, timeout_s: float = 600.0) -> None:
        """The server does not see our output repository: it loads its own copy of the model
        under the variant's config."""
        self.load_config(name, parse_model_config(config_text), timeout_s)

    def load_config(self, model: str, config: ModelConfig, timeout_s: float = 600.0) -> None:
        """Load `model` from the server's repository with `config` instead of its own."""
        named = ModelConfig()
        named.CopyFrom(config)
        named.name = model
        body = {"parameters": {"config": json_format.MessageToJson(named)}}
        self._repository_call(f"/v2/repository/models/{model}/load", timeout_s, body)

    def _get(self, path: str) -> tuple[int, str]:
        host, _, port = self.http_url.rpartition(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=5)
        try:
            conn.request("GET", path)
            response = conn.getresponse()
            return response.status, response.read().decode(errors="replace")[:200]
        except OSError as err:
            return 0, str(err)
        finally:
            conn.close()


def _host_port(url: str, field: str) -> str:
    """host:port from 'host:port' or 'http://host:port'; a clear error otherwise."""
    text = url.split("://", 1)[-1].rstrip("/")
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise LaunchSetupError(f"{field} '{url}' is not host:port")
    return text
