"""Docker launch: `tritonserver <flags>` in a container, through the docker SDK, as NVIDIA's MA
runs it: in the images this project builds `tritonserver` is our worker (model-analyzer-server);
in a Triton image (`nvcr.io/nvidia/tritonserver:...`) it is Triton itself, measured the same way.

The output model repository (where the variants are written, while the container runs) and the
model repository are mounted read-only at their own paths, so a variant's path means the same
inside and out. The worker listens on 127.0.0.1 only: with host networking (the default) it binds
127.0.0.1 itself; on a bridge network (`network_mode: bridge` in --triton-docker-args) it binds
0.0.0.0 inside the container and its ports are published on the host's 127.0.0.1 only. GPUs are
handed in as device requests.

The worker does not run as root: as the image's USER (uid 1000 in the images this project
builds), else as 1000:1000, unless `user` in --triton-docker-args names another. That user must
be able to read the repositories; a file it cannot read is one clear error before the worker
would fail on it. Our worker's repository API answers only the profiler's per-run key (given
in the container's environment).

Our worker's container never outlives the analyzer: it is created with auto-remove, and its
stdin is the worker's lifeline -- the launcher holds it open through an attached socket; when
the analyzer exits or is killed the socket closes, the worker sees end-of-file on stdin and
stops, and Docker removes the container. stop() also stops and removes it at once. Triton does
not watch its stdin: a Triton container outlives an analyzer killed with SIGKILL (as under MA)
until `docker rm -f`; every other exit stops it.
"""

from __future__ import annotations

import json
import os
import stat
import threading
import time
from pathlib import Path
from typing import Any

from analyzer.launch.base import (
    PORT_ATTEMPTS,
    PORT_TAKEN,
    READY_LINE,
    Launcher,
    LaunchError,
    LaunchSetupError,
    new_repository_key,
    open_log,
)

LABEL = "model-analyzer.worker"
OUR_IMAGE = "model-analyzer.source"  # the label of the images this project builds
WORKER_USER = "1000:1000"  # the `worker` user of the images built by this project


def docker_client() -> Any:
    """The daemon's client, or LaunchError saying it is unreachable and why."""
    try:
        import docker
    except ImportError:
        raise LaunchSetupError(
            "docker launch mode needs the docker SDK: pip install docker"
        ) from None
    try:
        client = docker.from_env(timeout=60)
        client.ping()
    except Exception as exc:  # docker.errors.DockerException and the transport's errors
        host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
        raise LaunchSetupError(
            f"the Docker daemon at {host} is unreachable ({str(exc).splitlines()[0][:200]}); "
            "start dockerd or set DOCKER_HOST"
        ) from None
    return client


def parse_mount(text: str) -> tuple[str, dict[str, str]]:
    """MA's 'host_path:container_path:mode' (mode ro or rw, default rw)."""
    parts = text.split(":")
    if len(parts) not in (2, 3) or not parts[0] or not parts[1] or (
        len(parts) == 3 and parts[2] not in ("ro", "rw")
    ):  # fmt: skip
        raise LaunchSetupError(
            f"triton_docker_mounts has '{text}'; expected host_path:container_path[:ro|rw]"
        )
    return str(Path(parts[0]).resolve()), {"bind": parts[1],
                                           "mode": parts[2] if len(parts) == 3 else "rw"}


class DockerLauncher(Launcher):
    def __init__(
        self,
        image: str,
        output_repository: Path,
        model_repository: Path,
        log_path: Path,
        extra_flags: dict[str, object] | None = None,
        startup_timeout_s: float = 120.0,
        gpus: list[str] | None = None,
        mounts: list[str] | None = None,
        shm_size: str | None = None,
        labels: dict[str, str] | None = None,
        run_args: dict[str, Any] | None = None,
        environment: dict[str, str] | None = None,
    ) -> None:  # fmt: skip
        self.image = image
        self.environment = dict(environment or {})  # MA's triton_server_environment
        self.output_repository = output_repository.resolve()
        self.model_repository = model_repository.resolve()
        self.log_path = log_path
        self.extra_flags = extra_flags or {}
        self.startup_timeout_s = startup_timeout_s
        self.gpus = gpus or []
        self.mounts = [parse_mount(m) for m in mounts or []]
        self.shm_size = shm_size or "1g"  # the python backend moves tensors through /dev/shm
        self.labels = dict(labels or {})
        self.run_args = dict(run_args or {})
        self.user = str(self.run_args.pop("user", "") or "")  # "" = the image's USER or WORKER_USER
        self.network = str(self.run_args.pop("network_mode", "host"))
        self.repository_key, self._key_env = new_repository_key()
        self.choose_ports()
        self.client: Any = None
        self.ours = True  # the image is one of ours (its label says so; set by check())
        self.container_id: str | None = None
        self._lifeline: Any = None
        self._log_thread: threading.Thread | None = None
        self._exit = ""

    # ---- the container ------------------------------------------------------------------------
    def _command(self) -> list[str]:
        """`tritonserver <flags>`, as MA runs a Triton image: our images have it on PATH (the
        worker's own command line); a Triton image runs Triton itself. Our worker also gets
        its lifeline flag; Triton gets one bind address per protocol."""
        # on a bridge the container's own loopback is unreachable: bind all of the container's
        # addresses, which only the host's 127.0.0.1 publishes
        host = "127.0.0.1" if self.network == "host" else "0.0.0.0"
        cmd = ["tritonserver", f"--model-repository={self.output_repository}",
               "--model-control-mode=explicit", f"--http-address={host}",
               f"--http-port={self.ports['http']}", f"--grpc-port={self.ports['grpc']}",
               f"--metrics-port={self.ports['metrics']}"]  # fmt: skip
        if self.ours:
            cmd += ["--exit-on-stdin-eof", f"--model-load-timeout-secs={self.load_timeout_s:g}"]
        else:
            cmd += [f"--grpc-address={host}", f"--metrics-address={host}"]
        for flag, value in self.extra_flags.items():
            cmd.append(f"--{str(flag).replace('_', '-')}={value}")
        return cmd

    def _host_config(self, api: Any) -> Any:
        import docker

        binds = {str(self.output_repository): {"bind": str(self.output_repository), "mode": "ro"},
                 str(self.model_repository): {"bind": str(self.model_repository), "mode": "ro"}}
        binds.update(dict(self.mounts))
        network = self.network
        ports = None
        if network != "host":
            ports = {f"{port}/tcp": ("127.0.0.1", port) for port in self.ports.values()}
        requests = []
        wanted = [g for g in self.gpus if g != "all"]
        if self.gpus and _host_has_gpus():
            requests = [docker.types.DeviceRequest(
                device_ids=wanted or None, count=None if wanted else -1,
                capabilities=[["gpu"]])]  # fmt: skip
        try:
            return api.create_host_config(
                binds=binds, port_bindings=ports, network_mode=network, shm_size=self.shm_size,
                auto_remove=True, device_requests=requests or None, **self.run_args)  # fmt: skip
        except TypeError as exc:
            raise LaunchSetupError(f"triton_docker_args: {exc}") from None

    def check(self) -> None:
        """The daemon answers and the image is here: said before anything is written."""
        import docker

        if self.client is None:
            self.client = docker_client()
        try:
            image = self.client.images.get(self.image)
        except docker.errors.ImageNotFound:
            raise LaunchSetupError(
                f"docker image '{self.image}' is not on this machine; build it with "
                "`make docker-image` (scripts/build_worker_image.sh) or name another with "
                "--triton-docker-image"
            ) from None
        labels = (image.attrs.get("Config") or {}).get("Labels") or {}
        self.ours = bool(labels.get(OUR_IMAGE))
        if not self.user:
            own = (image.attrs.get("Config") or {}).get("User") or ""
            self.user = own if own and not _is_root(own) else WORKER_USER
        self._check_readable(self.output_repository, walk=False)
        self._check_readable(self.model_repository, walk=False)
        self._check_umask()

    def load(self, name: str) -> None:
        """Load a variant, first making sure the container's user can read all of it."""
        self._check_readable(self.output_repository / name, walk=True)
        super().load(name)

    def enforces_load_timeout(self) -> bool:
        return self.ours

    def _check_readable(self, root: Path, walk: bool) -> None:
        ids = _numeric_ids(self.user)
        if ids is None or ids[0] == 0 or not root.exists():
            return  # a user name resolves only inside the image; root reads everything
        for path in _tree(root) if walk else [root]:
            try:
                info = os.stat(path)  # a symlink: what it points to is what gets read
            except OSError:
                continue  # dangling: the worker says which file is missing
            need = 0o5 if stat.S_ISDIR(info.st_mode) else 0o4
            if not _allowed(info.st_mode, info.st_uid, info.st_gid, ids, need):
                raise LaunchSetupError(
                    f"the docker worker runs as user {self.user} (not root) and cannot read "
                    f"{path} (mode {stat.S_IMODE(info.st_mode):04o}, owner uid {info.st_uid}); "
                    f"make the repository readable to it (chmod -R o+rX {root}) or pick a user "
                    "that can read it with --triton-docker-args "
                    + json.dumps({"user": "UID:GID"})
                )

    def _check_umask(self) -> None:
        """Variant folders the profiler writes later must be readable to the container's user."""
        ids = _numeric_ids(self.user)
        mask = _umask()
        if ids is None or ids[0] == 0 or mask is None:
            return
        if not _allowed(0o777 & ~mask, os.getuid(), os.getgid(), ids, 0o5):
            raise LaunchSetupError(
                f"the profiler's umask {mask:04o} makes the variants it writes unreadable to the "
                f"docker worker's user {self.user}; run with umask 022 or pick your own uid with "
                "--triton-docker-args " + json.dumps({"user": f"{os.getuid()}:{os.getgid()}"})
            )

    def start(self) -> None:
        for attempt in range(PORT_ATTEMPTS):
            try:
                self._start_once()
                return
            except LaunchError as exc:
                if isinstance(exc, LaunchSetupError) or PORT_TAKEN not in str(exc) or (
                        attempt == PORT_ATTEMPTS - 1):  # fmt: skip
                    raise
            self.stop()
            self.choose_ports()  # another process took a port between choice and bind

    def _start_once(self) -> None:
        import docker

        self.check()
        api = self.client.api
        open_log(self.log_path).close()  # created 0600 before the container writes to it
        offset = self.log_path.stat().st_size  # this start's lines come after
        labels = {LABEL: "true", f"{LABEL}.owner": f"{os.uname().nodename}:{os.getpid()}",
                  **self.labels}  # fmt: skip
        try:
            created = api.create_container(
                self.image, command=self._command(), stdin_open=True, detach=False,
                labels=labels, host_config=self._host_config(api), user=self.user,
                environment={**self.environment, **self._key_env}, ports=list(self.ports.values()),
            )  # fmt: skip
            self.container_id = created["Id"]
            # attached before start: from now on the container lives only while we do
            self._lifeline = api.attach_socket(self.container_id,
                                               params={"stdin": 1, "stream": 1})  # fmt: skip
            api.start(self.container_id)
            self.pid = api.inspect_container(self.container_id)["State"].get("Pid") or None
        except docker.errors.APIError as exc:
            self._remove()
            raise LaunchSetupError(f"docker could not start the worker container: "
                              f"{exc.explanation or exc}") from None  # fmt: skip
        self._exit = ""
        self._log_thread = threading.Thread(target=self._copy_logs, args=(self.container_id,),
                                            name="docker-logs", daemon=True)  # fmt: skip
        self._log_thread.start()
        self._wait_ready(offset)

    def _wait_ready(self, offset: int) -> None:
        """Ready when this start's log says so and its HTTP port answers: a port that answers
        while the log is silent is another process's. Triton's log has no such line: its
        readiness alone, with the container running."""
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if not self.alive():
                if self._log_thread is not None:
                    self._log_thread.join(timeout=2)  # the container's last words, copied
                raise LaunchError(f"the worker container exited ({self.exit_status()}); its "
                                  f"last log lines:\n{self.last_words()}")  # fmt: skip
            said = not self.ours or READY_LINE.encode() in self.log_path.read_bytes()[offset:]
            if said and self._answers():
                return
            time.sleep(0.2)
        self.stop()
        raise LaunchError(f"the worker container was not ready after "
                          f"{self.startup_timeout_s:.0f} s; its last log lines:\n"
                          f"{self.last_words()}")  # fmt: skip

    def _answers(self) -> bool:
        """The worker's HTTP port says it is ready (so the host reaches it, bridge or not)."""
        import http.client

        conn = http.client.HTTPConnection("127.0.0.1", self.ports["http"], timeout=2)
        try:
            conn.request("GET", "/v2/health/ready")
            return conn.getresponse().status == 200
        except OSError:
            return False
        finally:
            conn.close()

    def _copy_logs(self, container_id: str) -> None:
        try:
            with open_log(self.log_path) as log:
                for chunk in self.client.api.logs(container_id, stream=True, follow=True):
                    log.write(chunk)
                    log.flush()
        except Exception:  # noqa: BLE001 - the container went away: the log ends there
            pass

    def alive(self) -> bool:
        if self.container_id is None:
            return False
        try:
            state = self.client.api.inspect_container(self.container_id)["State"]
        except Exception:  # noqa: BLE001 - removed (auto-remove after exit)
            self._exit = self._exit or "exited; container removed"
            return False
        if state.get("Running"):
            return True
        self._exit = f"exit code {state.get('ExitCode')}" + (
            ", killed for memory" if state.get("OOMKilled") else "")
        return False

    def exit_status(self) -> str:
        return self._exit

    def stop(self) -> None:
        if self.container_id is None:
            return
        try:
            self.client.api.stop(self.container_id, timeout=10)
        except Exception:  # noqa: BLE001 - already gone
            pass
        self._remove()

    def _remove(self) -> None:
        if self._lifeline is not None:
            try:
                self._lifeline.close()
            except OSError:
                pass
            self._lifeline = None
        if self.container_id is not None:
            try:
                self.client.api.remove_container(self.container_id, force=True)
            except Exception:  # noqa: BLE001 - auto-removed already
                pass
            try:  # auto-remove may still be under way: stopped means gone
                self.client.api.wait(self.container_id, timeout=10, condition="removed")
            except Exception:  # noqa: BLE001 - gone already (404) or slow: nothing to keep
                pass
        if self._log_thread is not None:
            self._log_thread.join(timeout=5)
            self._log_thread = None
        self.container_id = None
        self.pid = None


def _host_has_gpus() -> bool:
    from analyzer.worker.devices import gpu_count

    return gpu_count() > 0


def _numeric_ids(user: str) -> tuple[int, int | None] | None:
    """(uid, gid) of 'uid[:gid]'; None for a user name (its ids live in the image)."""
    uid, _, gid = user.partition(":")
    if user in ("root", "0") or uid == "root":
        return (0, 0)
    if not user.isascii() or not uid.isdigit() or (gid and not gid.isdigit()):
        return None
    return int(uid), int(gid) if gid else None


def _is_root(user: str) -> bool:
    ids = _numeric_ids(user)
    return ids is not None and ids[0] == 0


def _allowed(mode: int, owner: int, group: int, ids: tuple[int, int | None], need: int) -> bool:
    uid, gid = ids
    shift = 6 if owner == uid else 3 if gid is not None and group == gid else 0
    return (mode >> shift) & need == need


def _tree(root: Path) -> list[Path]:
    found = [root]
    for folder, dirs, files in os.walk(root):
        found += [Path(folder, name) for name in (*dirs, *files)]
    return found


def _umask() -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return None
