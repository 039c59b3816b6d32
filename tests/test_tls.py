"""TLS: the worker's gRPC endpoint with tritonserver's --grpc-use-ssl flags (mutual TLS too), and
the load generator with perf_analyzer's --ssl-* flags over gRPC, gRPC streams and HTTPS (through
a TLS-terminating proxy in front of the worker's HTTP port: Triton serves no HTTPS itself)."""

from __future__ import annotations

import asyncio
import shutil
import ssl
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from serving import EXAMPLES, start_worker

from analyzer.loadgen.control import ServerError
from analyzer.loadgen.measure import MeasureSettings
from analyzer.loadgen.perf import PerfOptions, run_perf
from analyzer.tls import ClientTls, TlsError, client_tls

ROOT = Path(__file__).resolve().parent.parent
PERF_ANALYZER = ROOT / ".venv" / "bin" / "perf_analyzer"


def _certificate(folder: Path, name: str) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1/localhost (its own CA) and its key."""
    assert shutil.which("openssl"), "openssl is needed to make the tests' certificates"
    cert, key = folder / f"{name}.pem", folder / f"{name}.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout",
                    str(key), "-out", str(cert), "-days", "2", "-subj", f"/CN={name}",
                    "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
                   check=True, capture_output=True)  # fmt: skip
    return cert, key


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("certs")
    server, server_key = _certificate(folder, "server")
    client, client_key = _certificate(folder, "client")
    return {"server": server, "server_key": server_key, "client": client, "client_key": client_key}


@pytest.fixture(scope="module")
def tls_worker(certs):
    served = start_worker(EXAMPLES, "--grpc-use-ssl=true", "--grpc-server-cert",
                          str(certs["server"]), "--grpc-server-key", str(certs["server_key"]))
    yield served
    assert served.stop() == 0, "".join(served.output)


def _perf(url: str, protocol: str, tls: ClientTls | None, **kwargs) -> list:
    settings = MeasureSettings(mode="time_windows", window_ms=300, stability_pct=100, max_trials=2)
    options = PerfOptions(model="add_sub", url=url, protocol=protocol, settings=settings,
                          client_processes=1, concurrency=[2], ssl=tls, **kwargs)  # fmt: skip
    return list(run_perf(options))


@pytest.mark.parametrize("streaming", [False, True], ids=["unary", "streams"])
def test_grpc_over_tls(tls_worker, certs, streaming):
    tls = client_tls({"ssl-grpc-use-ssl": True,
                      "ssl-grpc-root-certifications-file": str(certs["server"])})  # fmt: skip
    points = _perf(tls_worker.grpc, "grpc", tls, streaming=streaming)
    assert points[0].error_count == 0, points[0].errors
    assert points[0].request_count > 10


def test_plain_grpc_to_a_tls_endpoint_fails(tls_worker):
    with pytest.raises(ServerError, match="cannot reach the server"):
        _perf(tls_worker.grpc, "grpc", None)


def test_nvidia_perf_analyzer_speaks_tls_to_the_worker(tls_worker, certs, tmp_path):
    run = subprocess.run([str(PERF_ANALYZER), "-m", "add_sub", "-u", tls_worker.grpc, "-i",
                          "grpc", "--ssl-grpc-use-ssl", "--ssl-grpc-root-certifications-file",
                          str(certs["server"]), "-p", "300", "-s", "100", "-r", "30",
                          "-f", str(tmp_path / "pa.csv")],
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert "throughput:" in run.stdout


def test_mutual_tls_needs_the_clients_certificate(certs):
    served = start_worker(EXAMPLES, "--grpc-use-ssl-mutual=true", "--grpc-server-cert",
                          str(certs["server"]), "--grpc-server-key", str(certs["server_key"]),
                          "--grpc-root-cert", str(certs["client"]))  # fmt: skip
    try:
        flags = {"ssl-grpc-use-ssl": True,
                 "ssl-grpc-root-certifications-file": str(certs["server"])}  # fmt: skip
        with pytest.raises(ServerError):
            _perf(served.grpc, "grpc", client_tls(flags))
        mutual = client_tls({**flags, "ssl-grpc-certificate-chain-file": str(certs["client"]),
                             "ssl-grpc-private-key-file": str(certs["client_key"])})
        points = _perf(served.grpc, "grpc", mutual)
        assert points[0].error_count == 0, points[0].errors
    finally:
        assert served.stop() == 0


class _TlsProxy:
    """HTTPS in front of the worker's HTTP port: TLS ends here, bytes go on to the worker."""

    def __init__(self, cert: Path, key: Path, target: str) -> None:
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.context.load_cert_chain(cert, key)
        self.host, port = target.rsplit(":", 1)
        self.target_port = int(port)
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        self.ready.wait(10)
        return f"https://127.0.0.1:{self.port}"

    def __exit__(self, *exc) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        server = self.loop.run_until_complete(
            asyncio.start_server(self._pipe, "127.0.0.1", 0, ssl=self.context))
        self.port = server.sockets[0].getsockname()[1]
        self.ready.set()
        self.loop.run_forever()
        server.close()

    async def _pipe(self, reader, writer) -> None:
        up_reader, up_writer = await asyncio.open_connection(self.host, self.target_port)

        async def copy(src, dst) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, ssl.SSLError):
                pass
            finally:
                dst.close()

        await asyncio.gather(copy(reader, up_writer), copy(up_reader, writer))


def test_https_with_the_servers_ca_and_without_verification(tls_worker, certs):
    with _TlsProxy(certs["server"], certs["server_key"], tls_worker.http) as url:
        verified = client_tls({"ssl-https-ca-certificates-file": str(certs["server"])})
        points = _perf(url, "http", verified)
        assert points[0].error_count == 0, points[0].errors
        unverified = client_tls({"ssl-https-verify-peer": 0, "ssl-https-verify-host": 0})
        assert _perf(url, "http", unverified)[0].error_count == 0
        with pytest.raises(ServerError, match="CERTIFICATE_VERIFY_FAILED|certificate verify"):
            _perf(url, "http", None)  # an unknown CA is refused by default


def test_tls_flags_that_cannot_work_are_one_sentence(tmp_path):
    with pytest.raises(TlsError, match="only PEM files"):
        client_tls({"ssl-https-client-certificate-type": "DER"}, "--")
    with pytest.raises(TlsError, match="ssl-https-verify-host 'x' must be one of 0, 1, 2"):
        client_tls({"ssl-https-verify-host": "x"})
    with pytest.raises(TlsError, match="does not exist"):
        client_tls({"ssl-grpc-use-ssl": True, "ssl-grpc-root-certifications-file":
                    str(tmp_path / "none.pem")}).context("grpc")  # fmt: skip
    run = subprocess.run([sys.executable, "-m", "analyzer", "serve", "--model-repository",
                          str(EXAMPLES), "--grpc-use-ssl=true"],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert run.returncode == 2
    assert "--grpc-use-ssl needs --grpc-server-cert and --grpc-server-key" in run.stderr


def _remote_profile(tmp_path: Path, protocol: str, http: str, grpc: str, metrics: str,
                    pa_flags: dict) -> subprocess.CompletedProcess:  # fmt: skip
    """A remote-mode profile of add_sub's own config at one load, its perf_analyzer_flags from
    a YAML file as an MA user writes them."""
    import yaml
    from test_profile import profile

    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump({"perf_analyzer_flags": pa_flags}))
    return profile(tmp_path, "-f", "cfg.yaml", "--model-repository", str(EXAMPLES),
                   "--profile-models", "add_sub", "--triton-launch-mode", "remote",
                   "--triton-http-endpoint", http, "--triton-grpc-endpoint", grpc,
                   "--triton-metrics-url", metrics, "--client-protocol", protocol,
                   "--run-config-search-disable", "--concurrency", "2",
                   "--measurement-interval", "300", "--max-trials", "3", "--final-rounds", "0",
                   "--client-max-retries", "3", "--output-model-repository-path", "OUT",
                   "--export-path", "EXP")  # fmt: skip


def test_remote_mode_controls_and_measures_a_server_over_tls(certs, tmp_path):
    """As MA's client does: the control calls (ready, load, unload) go to client_protocol's
    endpoint with perf_analyzer_flags' ssl-* keys, over gRPC with ssl-grpc-use-ssl and over
    HTTPS with an https:// triton_http_endpoint; without them the run stops with one line."""
    import json

    served = start_worker(EXAMPLES, "--model-control-mode", "explicit", "--grpc-use-ssl=true",
                          "--grpc-server-cert", str(certs["server"]), "--grpc-server-key",
                          str(certs["server_key"]))  # fmt: skip
    metrics = served.metrics
    try:
        grpc_flags = {"ssl-grpc-use-ssl": True,
                      "ssl-grpc-root-certifications-file": str(certs["server"])}  # fmt: skip
        with _TlsProxy(certs["server"], certs["server_key"], served.http) as https:
            runs = {
                "grpc": _remote_profile(tmp_path / "grpc", "grpc", served.http, served.grpc,
                                        metrics, grpc_flags),
                "https": _remote_profile(tmp_path / "https", "http", https, served.grpc, metrics,
                                         {"ssl-https-ca-certificates-file":
                                          str(certs["server"])}),
            }  # fmt: skip
            plain = _remote_profile(tmp_path / "plain", "grpc", served.http, served.grpc,
                                    metrics, {})  # fmt: skip
        for name, run in runs.items():
            assert run.returncode == 0, name + run.stdout + run.stderr
            document = json.loads((tmp_path / name / "EXP" / "results" /
                                   "profile_results.json").read_text())  # fmt: skip
            points = [m for c in document["models"][0]["configs"] for m in c["measurements"]]
            assert points and all(m["metrics"]["perf_throughput"] > 0 for m in points), name
        assert plain.returncode != 0
        assert "no server ready at triton_grpc_endpoint" in plain.stdout + plain.stderr
        assert "ssl-* keys of perf_analyzer_flags" in plain.stdout + plain.stderr
        assert served.process.poll() is None  # the server is not ours to stop
    finally:
        assert served.stop() == 0, "".join(served.output)
