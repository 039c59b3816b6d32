"""The one worker, load generator and monitors a profile run measures with.

A `WorkerSession` starts the worker (and restarts it when it died), loads a variant into it,
moves the load generator's processes and connections from variant to variant (a payload switch,
not a restart), samples the GPUs and the worker's CPU over the same windows, measures one point,
recovers after a failed config and shuts everything down at the end. The search loop
(profiler.py) and the final comparison (final_comparison.py) measure through it.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from analyzer.config.profile_config import ProfileConfig
from analyzer.launch.base import Launcher, LaunchError, LoadTimeoutError
from analyzer.launch.cpus import Placement
from analyzer.launch.docker import DockerLauncher
from analyzer.launch.local import LocalLauncher
from analyzer.launch.remote import RemoteLauncher
from analyzer.loadgen.client import LoadClient
from analyzer.loadgen.control import ControlClient, control_client
from analyzer.loadgen.inputs import model_io
from analyzer.loadgen.measure import Measurer, PerfPoint
from analyzer.loadgen.output import point_text
from analyzer.loadgen.perf import PerfOptions, encode, sequence_options, stream_mode
from analyzer.loadgen.server_stats import composing_models
from analyzer.loadgen.shm import SharedTensors
from analyzer.monitor.base import Sampler
from analyzer.monitor.cpu import CpuSampler
from analyzer.monitor.gpu import GpuSampler
from analyzer.monitor.metrics_gpu import MetricsGpuSampler
from analyzer.profile_setup import control_tls
from analyzer.repository.variants import serve_as
from analyzer.results.measurement import Measurement, from_point
from analyzer.results.outcome import ProfileOutcome
from analyzer.results.ranking import ConfigResult
from analyzer.results.together import combine_parts
from analyzer.search.base import SearchPoint
from analyzer.search.ledger import owner_id

Listener = Callable[[str, dict[str, Any]], None]  # (event, data) for progress displays


@dataclass
class ModelLoad:
    """One model's load generator, kept from point to point: its shard processes, the payloads
    they send (encoded for `key`: one variant, batch size and protocol), their shared-memory
    regions (--shared-memory system) and the ensemble steps whose statistics count. The session
    has one for the model measured, and one per model when models are profiled together."""

    client: LoadClient | None = None
    key: tuple | None = None
    shared: SharedTensors | None = None
    composing: list[str] = field(default_factory=list)

    def ready(self, key: tuple, control: ControlClient, opts: PerfOptions, processes: int,
              seed: int) -> LoadClient:  # fmt: skip
        """The client, sending the payloads of `key` (encoded now when they are not already):
        `opts` are the served model's, with its URL and batch size."""
        if self.key != key:
            config = control.model_config()
            io = model_io(control.model_metadata(), config)
            self.composing = composing_models(config)
            sequence = sequence_options(opts, config)
            stream = stream_mode(opts, config)
            self.drop_shared()
            payloads, self.shared = encode(opts, io, sequence, stream)
            if self.client is None:
                self.client = LoadClient(opts.protocol, opts.url, payloads, processes, seed,
                                         sequence, stream, opts.headers, opts.tls)  # fmt: skip
                self.client.start()
            else:
                self.client.set_payloads(payloads, sequence, stream)
            self.key = key
        assert self.client is not None
        return self.client

    def drop_shared(self) -> None:
        if self.shared is not None:
            self.shared.close()
            self.shared = None

    def close(self) -> None:
        self.drop_shared()
        if self.client is not None:
            self.client.close()
            self.client = None
        self.key = None


class WorkerSession:
    """The worker and the load generator of a whole run, and which variant is loaded now.

    `outcome` is the run's: the session counts worker starts in it and records the idle server's
    metrics there."""

    def __init__(self, config: ProfileConfig, outcome: ProfileOutcome, listener: Listener) -> None:
        self.config = config
        self.outcome = outcome
        self.listener = listener
        self.launcher: Launcher | None = None
        self.own = ModelLoad()  # the load generator of the model measured
        self.samplers: dict[str, Sampler] = {}
        self.loaded: str | None = None  # the variant loaded now
        self.loaded_as = ""  # the name it is served under
        # when a memory metric is ranked on, every variant gets a fresh worker (set per model)
        self.fresh_worker_per_variant = False
        # models served under their own names for a BLS variant: name -> (variant folder, the
        # worker start it was loaded into)
        self.serving: dict[str, tuple[str, int]] = {}
        self.placement = Placement(None, None, "")  # CPU sets, planned when the run starts
        # models profiled together: each model's own options and load, and the variants loaded
        self.together_options: dict[str, PerfOptions] = {}
        self.part_loads: dict[str, ModelLoad] = {}
        self.loaded_parts: list[str] = []

    def _ensure_worker(self) -> Launcher:
        launcher = self.ensure_launcher()
        if not launcher.alive():
            self.listener("worker_start", {})
            urls = (launcher.http_url, launcher.grpc_url)
            launcher.start()
            for load in (self.own, *self.part_loads.values()):
                if urls != (launcher.http_url, launcher.grpc_url):
                    load.close()  # a port was lost and re-chosen: reconnect at the new URL
                load.key = None  # a new worker knows no region: register them again
            self.outcome.worker_starts += 1
            self.loaded = None
            self.loaded_parts = []
            self._start_samplers()
        return launcher

    def ensure_launcher(self) -> Launcher:
        if self.launcher is None:
            c = self.config
            flags: dict[str, Any] = {}
            env: dict[str, str] = {}
            docker_args: dict[str, Any] = {}
            for spec in c.models:  # one worker serves every model: the run's own settings last
                flags.update(spec.triton_server_flags)
                env.update(spec.triton_server_environment)
                docker_args.update(spec.triton_docker_args)
            flags.update(c.triton_server_flags)
            env.update(c.triton_server_environment)
            docker_args.update(c.triton_docker_args or {})
            env = {k: os.path.expandvars(v) for k, v in env.items()}  # MA's $VAR lookups
            log = Path(c.triton_output_path or c.export / "logs" / "worker.log")
            # MA's client_max_retries: readiness checks one second apart
            startup = float(max(1, c.client_max_retries)) if c.client_max_retries is not None \
                else c.server_startup_timeout  # fmt: skip
            if c.triton_launch_mode == "remote":
                tls, headers = control_tls(c)
                self.launcher = RemoteLauncher(
                    c.triton_http_endpoint, c.triton_grpc_endpoint, c.triton_metrics_url,
                    startup, c.client_protocol, tls, headers)  # fmt: skip
            elif c.triton_launch_mode == "docker":
                self.launcher = DockerLauncher(
                    c.triton_docker_image, c.output_repository, Path(c.model_repository),
                    log, flags, startup,
                    gpus=[] if c.cpu_only else c.gpus, mounts=c.triton_docker_mounts,
                    shm_size=c.triton_docker_shm_size, labels=c.triton_docker_labels,
                    run_args={"cpuset_cpus": self.placement.worker_list, **docker_args}
                    if self.placement.worker else docker_args, environment=env,
                )  # fmt: skip
            else:
                self.launcher = LocalLauncher(
                    c.output_repository, log, flags,
                    startup, cpus=self.placement.worker_list, gpus=c.gpus,
                    environment=env,
                )  # fmt: skip
            self.launcher.load_timeout_s = c.model_load_timeout
        return self.launcher

    def _start_samplers(self) -> None:
        for sampler in self.samplers.values():
            sampler.stop()
        interval = self.config.monitoring_interval
        gpus = [g for g in self.config.gpus if g != "all"] or None
        if self.launcher is not None and self.launcher.remote:
            self.samplers = {"gpu": MetricsGpuSampler(self.launcher.metrics_url, gpus, interval)}
        else:
            self.samplers = {"gpu": GpuSampler(gpus, interval)}
        if self.launcher is not None and self.launcher.pid:
            self.samplers["cpu"] = CpuSampler(self.launcher.pid, interval)
        for sampler in self.samplers.values():
            sampler.start()
        gpu = self.samplers["gpu"]
        if gpu.available() and not self.outcome.server_only:
            t0 = time.monotonic_ns()  # the idle server: MA's server-only metrics
            seconds = self.config.duration_seconds  # MA's duration_seconds
            time.sleep(seconds if seconds is not None else max(0.5, 3 * interval))
            summary = gpu.summary(t0, time.monotonic_ns())
            self.outcome.server_only = [
                {"gpu_uuid": g.uuid, "gpu_used_memory": g.memory_used_max_mb,
                 "gpu_utilization": g.utilization_pct, "gpu_power_usage": g.power_w or 0.0}
                for g in summary.gpus
            ]  # fmt: skip

    def measure_point(
        self, result: ConfigResult, trial: SearchPoint, options: PerfOptions
    ) -> Measurement:
        """One point of a loaded (or now loaded) variant; the final comparison uses it too."""
        if result.together:
            return self._measure_together(result, trial, options)
        launcher = self._ensure_worker()
        # a remote server serves each variant under the model's own name, loaded by config
        served = result.model if launcher.remote else result.name
        if self.loaded != result.name:
            self.listener("load", {"result": result})
            with _fresh_worker_after_load_timeout(launcher):
                self._serve_composing(launcher, result)
                launcher.load_variant(served, result.config_text)
            self.loaded, self.loaded_as = result.name, served
        url = launcher.grpc_url if options.protocol == "grpc" else launcher.http_url
        opts = dataclasses.replace(options, model=served, url=url)
        control = control_client(options.protocol, url, served, headers=options.headers,
                                 tls=opts.tls)  # fmt: skip
        try:
            client = self.own.ready(
                (result.name, trial.batch_size, options.protocol), control,
                dataclasses.replace(opts, batch_size=trial.batch_size),
                max(1, self.config.client_processes), self.config.seed)  # fmt: skip
            measurer = Measurer(client, control, served, "", trial.batch_size, options.settings,
                                self.samplers, True, self.own.composing)  # fmt: skip
            self.listener("measure", {"result": result, "trial": trial})
            point = measurer.measure(trial.load, trial.value, options.distribution)
            auto = self.config.client_processes <= 0
            cores = len(os.sched_getaffinity(0))
            while (auto and point.more_clients_help
                   and len(client.shards) < options.process_limit(cores)):  # fmt: skip
                client.add_process()
                point = measurer.measure(trial.load, trial.value, options.distribution)
        finally:
            control.close()
        _still_alive(launcher)
        if self.config.perf_output:
            self._perf_output(result.name, trial, point)
        measurement = from_point(point, result.model, result.name, trial.load, trial.value,
                                 time.time())  # fmt: skip
        measurement.host = owner_id()
        return measurement

    def _measure_together(
        self, result: ConfigResult, trial: SearchPoint, options: PerfOptions
    ) -> Measurement:
        """One point of models profiled together: every model's variant loaded at once, each
        model driven by its own load generator at the trial's load, all measured at the same
        time (a model whose windows settle first keeps its load on until the last is done, so
        every model is measured beside the others' load). `options` gives the measurement
        settings (the search's, or a final round's); the rest is each model's own."""
        launcher = self._ensure_worker()
        served = {model: model if launcher.remote else variant
                  for model, variant, _ in result.together}  # fmt: skip
        if self.loaded != result.name:
            self._unload_parts()
            self.listener("load", {"result": result})
            with _fresh_worker_after_load_timeout(launcher):
                for model, _, text in result.together:
                    launcher.load_variant(served[model], text)
                    self.loaded_parts.append(served[model])
            self.loaded = self.loaded_as = result.name
        measurers: dict[str, Measurer] = {}
        controls = []
        try:
            for index, (model, variant, _) in enumerate(result.together):
                own = self.together_options[model]
                url = launcher.grpc_url if own.protocol == "grpc" else launcher.http_url
                opts = dataclasses.replace(own, model=served[model], url=url,
                                           settings=options.settings,
                                           batch_size=trial.batch_size)  # fmt: skip
                control = control_client(own.protocol, url, served[model], headers=own.headers,
                                         tls=opts.tls)  # fmt: skip
                controls.append(control)
                part = self.part_loads.setdefault(model, ModelLoad())
                client = part.ready((variant, trial.batch_size, own.protocol), control, opts,
                                    max(1, self.config.client_processes),
                                    self.config.seed + index)  # fmt: skip
                # the worker's CPU and GPU samples are the whole server's: read once
                measurers[model] = Measurer(client, control, served[model], "",
                                            trial.batch_size, options.settings,
                                            self.samplers if index == 0 else {}, True,
                                            part.composing)  # fmt: skip
            self.listener("measure", {"result": result, "trial": trial})
            points = _measure_at_once(measurers, trial, options.distribution)
        finally:
            for control in controls:
                control.close()
        _still_alive(launcher)
        now = time.time()
        parts = {}
        for model, variant, _ in result.together:
            if self.config.perf_output:
                self._perf_output(variant, trial, points[model])
            parts[model] = from_point(points[model], model, variant, trial.load, trial.value, now)
        measurement = combine_parts(parts, result.model, result.name)
        measurement.host = owner_id()
        return measurement

    def _unload_parts(self) -> None:
        """Unload the variants of the joint config loaded now (their loads idled first)."""
        if not self.loaded_parts or self.launcher is None:
            return
        for part in self.part_loads.values():
            if part.client is not None:
                part.client.quiesce(30)
        for name in self.loaded_parts:
            try:
                self.launcher.unload(name)
            except LaunchError:
                pass  # a worker that cannot unload is restarted by the next load if it died
        self.loaded_parts = []

    def _perf_output(self, name: str, trial: SearchPoint, point: PerfPoint) -> None:
        """MA's perf_output: each point's report as perf_analyzer words it, appended to
        perf_output_path (or printed)."""
        text = (f"*** {name}: {trial.load.replace('_', ' ')} {trial.value}, batch size "
                f"{trial.batch_size} ***\n{point_text(point)}\n")  # fmt: skip
        path = self.config.perf_output_path
        if path is None:
            print(text, flush=True)
            return
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a") as out:
            out.write(text + "\n")

    def _serve_composing(self, launcher: Launcher, result: ConfigResult) -> None:
        """A BLS variant's composing models, served under the names its code calls (loaded
        again only when the config under that name changes)."""
        for name, variant in result.serve_first:
            if self.serving.get(name) == (variant, self.outcome.worker_starts):
                continue
            serve_as(self.config.output_repository, variant, name)
            launcher.load(name)
            self.serving[name] = (variant, self.outcome.worker_starts)

    def failure_text(self, err: Exception) -> str:
        text = str(err).strip()
        launcher = self.launcher
        if launcher is not None and not launcher.alive() and not text.startswith("the worker"):
            status = launcher.exit_status()
            text = (f"the worker exited ({status or 'unknown status'}) while serving this "
                    f"config ({text}); its last log lines:\n{launcher.last_words()}")  # fmt: skip
        return text

    def recover(self) -> None:
        """After a failed config: idle the load, unload, and restart the worker if it died.

        Requests still unanswered after the wait mean the model hangs in execute(): a worker of
        ours is stopped then (its model processes with it) rather than asked to unload, which
        waits a minute for the hung batch, and the next config starts a fresh one."""
        stuck = False
        for load in (self.own, *self.part_loads.values()):
            if load.client is not None:
                try:
                    load.client.quiesce(10)
                    stuck = stuck or load.client.outstanding() > 0
                except (OSError, ConnectionError, EOFError):
                    load.close()
        launcher = self.launcher
        if launcher is not None and stuck and not launcher.remote:
            for load in (self.own, *self.part_loads.values()):
                load.close()  # its connections wait on the stopped worker
            launcher.stop()
        if launcher is not None and not launcher.alive():
            self.loaded = None
            self.loaded_parts = []
            return  # restarted lazily by the next measurement
        self.unload_variant()

    def unload_variant(self) -> None:
        if self.loaded is None or self.launcher is None:
            return
        if self.loaded_parts:  # models profiled together: every model's variant
            self._unload_parts()
            self.loaded = None
            if self.fresh_worker_per_variant:
                self.launcher.stop()
            return
        if self.own.client is not None:
            self.own.client.quiesce(30)
        try:
            self.launcher.unload(self.loaded_as)
        except LaunchError:
            pass  # a worker that cannot unload is restarted by the next load if it died
        self.loaded = None
        self.own.key = None
        if self.fresh_worker_per_variant:
            self.launcher.stop()  # started again, clean, by the next measurement

    def mark_loaded(self, name: str) -> None:
        """`name` is still loaded in this worker (loaded before, under its own name): the next
        measurement of it needs no load."""
        self.loaded = self.loaded_as = name

    def unload_all(self, names: set[str]) -> None:
        """Unload the variants `names` (several may be loaded together in a local worker)."""
        if self.launcher is None:
            return
        if self.own.client is not None:
            self.own.client.quiesce(30)
        for name in names:
            if name == self.loaded_as and self.loaded is not None:
                self.unload_variant()
                continue
            try:
                self.launcher.unload(name)
            except LaunchError:
                pass  # a worker that cannot unload is restarted by the next load if it died

    def shutdown(self) -> None:
        for sampler in self.samplers.values():
            sampler.stop()
        for load in (self.own, *self.part_loads.values()):
            load.close()
        if self.launcher is not None:
            self.launcher.stop()


@contextmanager
def _fresh_worker_after_load_timeout(launcher: Launcher) -> Iterator[None]:
    """A worker of ours that did not answer a load in time holds that load in an unknown state
    (a model's process may still run and take CPU or GPU memory): it is stopped, and the next
    config starts a fresh one."""
    try:
        yield
    except LoadTimeoutError:
        if not launcher.remote:
            launcher.stop()
        raise


def _still_alive(launcher: Launcher) -> None:
    """LaunchError, with the worker's last words, when it died during the measurement."""
    if not launcher.alive():
        raise LaunchError(
            f"the worker exited ({launcher.exit_status()}) during the measurement; its last "
            f"log lines:\n{launcher.last_words()}"
        )


def _measure_at_once(measurers: dict[str, Measurer], trial: SearchPoint,
                     distribution: str) -> dict[str, PerfPoint]:  # fmt: skip
    """Each model's point, measured in threads of their own at the same time; the first error
    (after all have finished) is raised."""
    points: dict[str, PerfPoint] = {}
    errors: list[BaseException] = []

    def measure(model: str, measurer: Measurer) -> None:
        try:
            points[model] = measurer.measure(trial.load, trial.value, distribution)
        except BaseException as err:  # raised in the caller's thread below
            errors.append(err)

    threads = [threading.Thread(target=measure, args=item, daemon=True, name=f"measure {item[0]}")
               for item in measurers.items()]  # fmt: skip
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return points
