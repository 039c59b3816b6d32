"""The profile loop: ask the search for a trial, make and load the variant, measure, store, tell.

One worker and one load generator serve the whole run: variants are loaded into the running worker
through the repository API (each variant's instances are created fresh on load and destroyed on
unload, so nothing of the previous variant stays), and the load generator's processes and
connections move from variant to variant. The worker is restarted when it died, and between
variants when a memory metric is an objective or constraint (allocators keep freed memory).
Every point goes to the checkpoint the moment it is measured; a rerun replays the search from it
and measures only what is missing (no worker is even started when nothing is).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from analyzer.config.model_config import ModelConfig, format_model_config
from analyzer.config.profile_config import ModelSpec, ProfileConfig, ProfileConfigError
from analyzer.final_comparison import calibrate_default, run_final_comparison
from analyzer.fsutil import OutputFolder, claim_output_folder, refuse_overlap
from analyzer.launch.base import Launcher, LaunchError, LaunchSetupError
from analyzer.launch.cpus import CpuListError, Placement, pinned, plan_placement
from analyzer.launch.docker import DockerLauncher
from analyzer.launch.local import LocalLauncher
from analyzer.launch.remote import RemoteLauncher
from analyzer.loadgen.client import LoadClient
from analyzer.loadgen.control import ServerError, control_client
from analyzer.loadgen.inputs import InputError, model_io, parse_shapes
from analyzer.loadgen.measure import MeasurementError, Measurer, MeasureSettings
from analyzer.loadgen.perf import PerfOptions, encode_payloads
from analyzer.monitor.base import Sampler
from analyzer.monitor.cpu import CpuSampler
from analyzer.monitor.gpu import GpuSampler
from analyzer.monitor.metrics_gpu import MetricsGpuSampler
from analyzer.repository.repository import (
    ModelSource,
    RepositoryError,
    files_digest,
    list_models,
    read_model,
)
from analyzer.repository.variants import (
    VariantError,
    default_variant,
    describe,
    make_variant,
    write_variant,
)
from analyzer.results.checkpoint import Checkpoint, config_key, point_key
from analyzer.results.measurement import Measurement, from_point, from_shared
from analyzer.results.metrics import DIRECTIONS, MEMORY_TAGS
from analyzer.results.outcome import ModelOutcome, ProfileOutcome
from analyzer.results.ranking import ConfigResult, Ranker, recommended_first
from analyzer.search.base import Outcome, SearchLimits, SearchPoint, SearchStrategy
from analyzer.search.brute import BruteSearch
from analyzer.search.ledger import SharedPoint, owner_id, redact_url, unmerged
from analyzer.search.optuna import OptunaSearch, OptunaSettings
from analyzer.search.quick import QuickSearch
from analyzer.search.space import load_search_space
from analyzer.worker.devices import gpu_count

Listener = Callable[[str, dict[str, Any]], None]  # (event, data) for progress displays


def _outcome(ranker: Ranker, result: ConfigResult, measurement: Measurement,
             violations: list[str]) -> Outcome:  # fmt: skip
    """What the search is told of a measured point (and a shared study stores)."""
    return Outcome(
        ok=True,
        throughput=measurement.metrics["perf_throughput"],
        breaks_latency_limit=ranker.breaks_latency_limit(measurement),
        satisfies_constraints=not violations,
        score=ranker.score(measurement), metrics=measurement.metrics,
        constraints=ranker.constraint_values(measurement),
        measurement=measurement.to_dict(),
        config={"description": result.description, "config_text": result.config_text},
    )  # fmt: skip


class Profiler:
    def __init__(self, config: ProfileConfig, listener: Listener | None = None) -> None:
        self.config = config
        self.listener = listener or (lambda event, data: None)
        self.launcher: Launcher | None = None
        self.client: LoadClient | None = None
        self.samplers: dict[str, Sampler] = {}
        self.loaded: str | None = None  # the variant loaded now
        self.loaded_as = ""  # the name it is served under
        self.payload_key: tuple | None = None
        self.outcome = ProfileOutcome(config, [])
        self.fresh_worker_per_variant = False
        self.placement = Placement(None, None, "")  # CPU sets, planned when the run starts

    # ---- set-up ---------------------------------------------------------------------------------
    def _check_modes(self) -> None:
        c = self.config
        for tag in c.optuna_objectives or []:
            if tag not in DIRECTIONS:
                raise ProfileConfigError(
                    f"optuna_objectives has '{tag}'; known: {', '.join(DIRECTIONS)}"
                )

    def _check_folders(self) -> None:
        """The one folder a run may delete must hold nothing else of the user's or of the run:
        refused before anything is written."""
        c = self.config
        repo, export = Path(c.model_repository), c.export
        every = {"is", "contains", "inside"}
        mine = {"is", "contains"}  # the default layout puts it inside these (./output_models)
        refuse_overlap("output_model_repository_path", c.output_repository, {
            "root folder": (Path("/"), mine),
            "home folder": (Path.home(), mine),
            "working directory": (Path.cwd(), mine),
            "model repository": (repo, every),
            "export path": (export, mine),
            "results folder": (export / "results", every),
            "reports folder": (export / "reports", every),
            "logs folder": (export / "logs", every),
            "checkpoint folder": (c.checkpoints, every),
        })  # fmt: skip
        refuse_overlap("export_path", export, {"model repository": (repo, {"is", "inside"})})
        refuse_overlap("checkpoint_directory", c.checkpoints,
                       {"model repository": (repo, {"is", "inside"})})  # fmt: skip

    def _prepare_output(self, checkpoint: Checkpoint) -> OutputFolder:
        """The output model repository, locked for this run (see fsutil.claim_output_folder)."""
        out = self.config.output_repository
        resuming = checkpoint.resumed and checkpoint.meta.get("output_repository") == str(out)
        folder = claim_output_folder(out, self.config.override_output_model_repository, resuming)
        if not resuming:
            checkpoint.record_meta(output_repository=str(out), started=time.time())
        return folder

    def _settings(self, spec: ModelSpec) -> tuple[MeasureSettings, PerfOptions]:
        c, flags = self.config, spec.perf_analyzer_flags
        window = int(flags.get("measurement-interval", c.measurement_interval))
        settings = MeasureSettings(
            mode=str(flags.get("measurement-mode", c.measurement_mode)),
            window_ms=window,
            request_count=int(flags.get("measurement-request-count", c.measurement_request_count)),
            stability_pct=float(flags.get("stability-percentage", c.stability_percentage)),
            max_trials=int(flags.get("max-trials", c.max_trials)),
            percentile=int(flags["percentile"]) if "percentile" in flags else None,
            min_window_ms=min(1000, window),
        )
        shapes = flags.get("shape") or c.shape or []
        options = PerfOptions(
            model=spec.name,
            protocol=str(flags.get("protocol", c.client_protocol)),
            distribution=str(flags.get("request-distribution", "constant")),
            input_data=str(flags.get("input-data", "random")),
            shapes=parse_shapes([shapes] if isinstance(shapes, str) else list(shapes)),
            string_length=int(flags.get("string-length", 128)),
            settings=settings,
            seed=c.seed,
        )
        return settings, options

    # ---- run ------------------------------------------------------------------------------------
    def run(self) -> ProfileOutcome:
        started = time.monotonic()
        self._check_modes()
        list_models(self.config.model_repository)  # a missing repository ends the run here
        space = load_search_space(self.config.search_space)
        placement = self.placement = self._placement()  # before the launcher: it starts there
        self.outcome.placement = placement.to_dict()
        if self.config.triton_launch_mode in ("remote", "docker"):
            # bad endpoints, no daemon or no image: one error before anything is written
            self.ensure_launcher().check()
        self._check_folders()
        checkpoint = Checkpoint(self.config.checkpoints)
        output = self._prepare_output(checkpoint)
        self.listener("placement", {"how": placement.how})
        try:
            with pinned(placement.client):  # the shards it starts inherit the set
                self._profile_models(checkpoint, space)
        finally:
            self._shutdown()
            output.release()
        for model in self.outcome.models:
            ranker = Ranker(model.spec.objectives, model.spec.constraints, model.pareto)
            model.results = recommended_first(ranker.rank(model.results), model.comparison)
        self.outcome.wall_s = time.monotonic() - started
        return self.outcome

    def _placement(self) -> Placement:
        """The worker's and the load generator's CPU sets (see launch/cpus.py)."""
        c = self.config
        worker = c.worker_cpus
        docker_set = str((c.triton_docker_args or {}).get("cpuset_cpus", ""))
        if c.triton_launch_mode == "docker" and docker_set and not worker:
            worker = docker_set  # the container's own cpuset is the worker's set
        try:
            return plan_placement(worker, c.client_cpus, c.triton_launch_mode != "remote")
        except CpuListError as err:
            raise ProfileConfigError(str(err)) from None

    def _profile_models(self, checkpoint: Checkpoint, space) -> None:
        if self.config.triton_launch_mode == "remote":  # the server's GPUs, from its metrics
            server_gpus = MetricsGpuSampler(self.config.triton_metrics_url).available()
            use_gpu = server_gpus and not self.config.cpu_only
        else:
            use_gpu = gpu_count() > 0 and not self.config.cpu_only
        self.outcome.kind = "GPU" if use_gpu else "CPU"
        for spec in self.config.models:
            model = ModelOutcome(spec)
            self.outcome.models.append(model)
            try:
                source = read_model(self.config.model_repository, spec.name)
            except RepositoryError as err:
                model.error = str(err)
                self.listener("model_failed", {"model": spec.name, "error": model.error})
                continue
            self._profile_model(model, source, space, checkpoint, use_gpu)
            self.listener("model_done", {"model": spec.name})

    def _limits(self, spec: ModelSpec, source: ModelSource) -> SearchLimits:
        c = self.config
        return SearchLimits(
            own_max_batch_size=source.config.max_batch_size,
            min_model_batch_size=c.run_config_search_min_model_batch_size,
            max_model_batch_size=c.run_config_search_max_model_batch_size,
            min_instance_count=c.run_config_search_min_instance_count,
            max_instance_count=c.run_config_search_max_instance_count,
            min_concurrency=c.run_config_search_min_concurrency,
            max_concurrency=c.run_config_search_max_concurrency,
            min_request_rate=c.run_config_search_min_request_rate,
            max_request_rate=c.run_config_search_max_request_rate,
            batch_sizes=spec.batch_sizes,
            concurrency=spec.concurrency,
            request_rate=spec.request_rate,
            request_rate_search=c.request_rate_search_enable,
            search_disable=c.run_config_search_disable,
            early_exit=c.early_exit_enable,
            manual=spec.model_config_parameters,
        )

    def _profile_model(
        self, model: ModelOutcome, source: ModelSource, space, checkpoint: Checkpoint,
        use_gpu: bool,
    ) -> None:  # fmt: skip
        spec = model.spec
        cpu_only = spec.cpu_only or not use_gpu
        try:
            settings, options = self._settings(spec)
        except (InputError, ValueError) as err:
            model.error = f"model '{spec.name}': {err}"
            self.listener("model_failed", {"model": spec.name, "error": model.error})
            return
        fingerprint = [spec.name, files_digest(source.path), options.protocol,
                       options.input_data, options.distribution, sorted(options.shapes.items()),
                       options.string_length, settings.mode, settings.window_ms,
                       settings.request_count, settings.stability_pct, settings.max_trials,
                       settings.percentile, spec.batch_sizes]  # fmt: skip
        # Unloading frees a variant's instances, but allocators keep some memory (torch's CUDA
        # cache, glibc arenas): when memory is ranked on, each variant gets a fresh worker.
        self.fresh_worker_per_variant = bool(MEMORY_TAGS & (set(spec.objectives)
                                                            | set(spec.constraints)))  # fmt: skip
        search = self._strategy(spec, source, space, json.dumps(fingerprint[:1] + fingerprint[2:]),
                                model)
        variants: dict[str, ConfigResult | None] = {}
        try:
            self._search(model, source, search, variants, cpu_only, fingerprint, checkpoint,
                         options)
        finally:
            search.close()
        self._merge_shared(model, source, search.shared_points(), variants, cpu_only)
        if not model.error:
            run_final_comparison(self, model, options, checkpoint, json.dumps(fingerprint))

    def _search(
        self, model: ModelOutcome, source: ModelSource, search: SearchStrategy,
        variants: dict[str, ConfigResult | None], cpu_only: bool, fingerprint: list,
        checkpoint: Checkpoint, options: PerfOptions,
    ) -> None:  # fmt: skip
        spec = model.spec
        ranker = Ranker(spec.objectives, spec.constraints)
        current: ConfigResult | None = None
        fingerprint_text = json.dumps(fingerprint)
        while (trial := search.ask()) is not None:
            if trial.params_json not in variants:
                variants[trial.params_json] = self._new_variant(model, source, trial, cpu_only)
            result = variants[trial.params_json]
            if result is None:  # a combination that cannot work
                search.tell(trial, Outcome(ok=False, error="cannot be built"))
                continue
            if current is not None and current is not result:
                self.unload_variant()
            current = result
            ckey = config_key(result.config_text, fingerprint_text)
            if ckey in checkpoint.failures:
                result.error = checkpoint.failures[ckey]
                search.tell(trial, Outcome(ok=False, error=result.error))
                continue
            pkey = point_key(result.config_text, trial.load, trial.value, trial.batch_size,
                             fingerprint_text)  # fmt: skip
            try:
                measurement, fresh = self._reuse_or_measure(result, trial, options, checkpoint,
                                                            ckey, pkey)  # fmt: skip
            except InputError as err:
                model.error = f"model '{spec.name}': {err}"
                self.listener("model_failed", {"model": spec.name, "error": model.error})
                break
            if measurement is None:
                search.tell(trial, Outcome(ok=False, error=result.error))
                continue
            result.measurements.append(measurement)
            violations = ranker.violations(measurement)
            self.listener("point", {"result": result, "measurement": measurement,
                                    "violations": violations})  # fmt: skip
            # the search first: a shared study's ledger is where other processes look for it
            search.tell(trial, _outcome(ranker, result, measurement, violations))
            if fresh:
                checkpoint.record_point(pkey, measurement)
            if (result.is_default and model.calibration is None and self.config.final_rounds
                    is None and not self.fresh_worker_per_variant):  # fmt: skip
                model.calibration = calibrate_default(self, result, trial, options, checkpoint,
                                                      fingerprint_text)  # fmt: skip
        self.unload_variant()

    def _reuse_or_measure(
        self, result: ConfigResult, trial: SearchPoint, options: PerfOptions,
        checkpoint: Checkpoint, ckey: str, pkey: str,
    ) -> tuple[Measurement | None, bool]:  # fmt: skip
        """The point from the checkpoint, or measured now: (measurement, measured now). None when
        the config failed (its reason recorded, the worker recovered); InputError ends the
        model, LaunchSetupError the run."""
        measurement = checkpoint.points.get(pkey)
        if measurement is not None:
            measurement.config_name = result.name
            self.outcome.reused += 1
            return measurement, False
        try:
            measurement = self.measure_point(result, trial, options)
        except LaunchSetupError:
            raise
        except (LaunchError, ServerError, MeasurementError, OSError) as err:
            result.error = self.failure_text(err)
            checkpoint.record_failure(ckey, result.error)
            self.listener("config_failed", {"result": result})
            self.recover()
            return None, False
        self.outcome.measured += 1
        return measurement, True

    def _merge_shared(
        self, model: ModelOutcome, source: ModelSource, points: list[SharedPoint],
        variants: dict[str, ConfigResult | None], cpu_only: bool,
    ) -> None:  # fmt: skip
        """Points other processes sharing the study measured join this run's results."""
        for point in unmerged(points, variants):
            t = point.trial
            if t.params_json not in variants:
                variants[t.params_json] = self._new_variant(model, source, t, cpu_only)
            result = variants[t.params_json]
            if result is None:
                continue
            result.measurements.append(from_shared(point, result.name))
            self.outcome.shared += 1

    def _strategy(
        self, spec: ModelSpec, source: ModelSource, space, fingerprint: str, model: ModelOutcome
    ) -> SearchStrategy:
        c = self.config
        limits = self._limits(spec, source)
        mode = c.run_config_search_mode
        if mode == "brute" or limits.manual or limits.search_disable:
            return BruteSearch(space, limits)
        if mode == "quick":
            return QuickSearch(space, limits, top_configs=c.num_configs_per_model)
        tags = tuple(c.optuna_objectives or ())
        study_name = c.study_name or f"model-analyzer-{spec.name}"
        if c.study_name and len(c.models) > 1:
            study_name = f"{c.study_name}-{spec.name}"  # one study per model
        storage = c.storage or f"sqlite:///{c.checkpoints / 'optuna.db'}"
        c.checkpoints.mkdir(parents=True, exist_ok=True)
        settings = OptunaSettings(
            storage=storage, study_name=study_name,
            sampler=c.optuna_sampler, seed=c.seed, min_trials=c.optuna_min_trials,
            max_trials=c.optuna_max_trials, early_exit_threshold=c.optuna_early_exit_threshold,
            min_percentage=c.min_percentage_of_search_space,
            max_percentage=c.max_percentage_of_search_space, objectives=tags,
            fingerprint=fingerprint,
        )  # fmt: skip
        # the results file names the study; a password in the URL is not written down
        model.study = {"storage": redact_url(storage), "study_name": settings.study_name}
        model.pareto = list(tags) if len(tags) > 1 else []
        directions = [
            "maximize" if DIRECTIONS[t] else "minimize" for t in tags
        ] or ["maximize"]
        return OptunaSearch(space, limits, settings, c.num_configs_per_model, directions)

    def _new_variant(
        self, model: ModelOutcome, source: ModelSource, trial: SearchPoint, cpu_only: bool
    ) -> ConfigResult | None:
        params = trial.params
        try:
            config = make_variant(source.config, params, cpu_only) if params else (
                default_variant(source.config, cpu_only))  # fmt: skip
        except VariantError as err:
            model.skipped.append(f"{json.dumps(params, sort_keys=True)}: {err}")
            return None
        index = sum(1 for r in model.results if not r.is_default)
        name = f"{source.name}_config_{'default' if not params else index}"
        folder = self.config.output_repository / name
        write_variant(source.path, config, folder)
        content = ModelConfig()
        content.CopyFrom(config)
        content.name = ""
        named = ModelConfig()
        named.CopyFrom(config)
        named.name = name
        result = ConfigResult(
            model=source.name,
            name=name,
            params=params,
            description=describe(config),
            config_text=format_model_config(content),
            path=str(folder),
            is_default=not params,
        )
        result.description["config_pbtxt"] = format_model_config(named)
        model.results.append(result)
        self.listener("variant", {"result": result})
        return result

    # ---- worker and load generator -------------------------------------------------------------
    def _ensure_worker(self) -> Launcher:
        launcher = self.ensure_launcher()
        if not launcher.alive():
            self.listener("worker_start", {})
            urls = (launcher.http_url, launcher.grpc_url)
            launcher.start()
            if urls != (launcher.http_url, launcher.grpc_url) and self.client is not None:
                self.client.close()  # a port was lost and re-chosen: reconnect at the new URL
                self.client, self.payload_key = None, None
            self.outcome.worker_starts += 1
            self.loaded = None
            self._start_samplers()
        return launcher

    def ensure_launcher(self) -> Launcher:
        if self.launcher is None:
            c = self.config
            flags = {}
            for spec in c.models:
                flags.update(spec.triton_server_flags)
            flags.update(c.triton_server_flags)
            if c.triton_launch_mode == "remote":
                self.launcher = RemoteLauncher(c.triton_http_endpoint, c.triton_grpc_endpoint,
                                               c.triton_metrics_url, c.server_startup_timeout)
            elif c.triton_launch_mode == "docker":
                self.launcher = DockerLauncher(
                    c.triton_docker_image, c.output_repository, Path(c.model_repository),
                    c.export / "logs" / "worker.log", flags, c.server_startup_timeout,
                    gpus=[] if c.cpu_only else c.gpus, mounts=c.triton_docker_mounts,
                    shm_size=c.triton_docker_shm_size, labels=c.triton_docker_labels,
                    run_args={"cpuset_cpus": self.placement.worker_list,
                              **(c.triton_docker_args or {})}
                    if self.placement.worker else c.triton_docker_args,
                )  # fmt: skip
            else:
                self.launcher = LocalLauncher(
                    c.output_repository, c.export / "logs" / "worker.log", flags,
                    c.server_startup_timeout, cpus=self.placement.worker_list, gpus=c.gpus,
                )  # fmt: skip
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
            time.sleep(max(0.5, 3 * interval))
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
        launcher = self._ensure_worker()
        # a remote server serves each variant under the model's own name, loaded by config
        served = result.model if launcher.remote else result.name
        if self.loaded != result.name:
            self.listener("load", {"result": result})
            launcher.load_variant(served, result.config_text)
            self.loaded, self.loaded_as = result.name, served
        url = launcher.grpc_url if options.protocol == "grpc" else launcher.http_url
        control = control_client(options.protocol, url, served)
        try:
            key = (result.name, trial.batch_size, options.protocol)
            if self.payload_key != key:
                io = model_io(control.model_metadata(), control.model_config())
                opts = dataclasses.replace(options, model=served, url=url,
                                           batch_size=trial.batch_size)  # fmt: skip
                payloads = encode_payloads(opts, io)
                if self.client is None:
                    processes = max(1, self.config.client_processes)
                    self.client = LoadClient(options.protocol, url, payloads, processes,
                                             self.config.seed)  # fmt: skip
                    self.client.start()
                else:
                    self.client.set_payloads(payloads)
                self.payload_key = key
            measurer = Measurer(self.client, control, served, "", trial.batch_size,
                                options.settings, self.samplers, True)  # fmt: skip
            self.listener("measure", {"result": result, "trial": trial})
            point = measurer.measure(trial.load, trial.value, options.distribution)
            auto = self.config.client_processes <= 0
            cores = len(os.sched_getaffinity(0))
            while auto and point.more_clients_help and len(self.client.shards) < cores:
                self.client.add_process()
                point = measurer.measure(trial.load, trial.value, options.distribution)
        finally:
            control.close()
        if not launcher.alive():
            raise LaunchError(
                f"the worker exited ({launcher.exit_status()}) during the measurement; its last "
                f"log lines:\n{launcher.last_words()}"
            )
        measurement = from_point(point, result.model, result.name, trial.load, trial.value,
                                 time.time())  # fmt: skip
        measurement.host = owner_id()
        return measurement

    def failure_text(self, err: Exception) -> str:
        text = str(err).strip()
        launcher = self.launcher
        if launcher is not None and not launcher.alive() and not text.startswith("the worker"):
            status = launcher.exit_status()
            text = (f"the worker exited ({status or 'unknown status'}) while serving this "
                    f"config ({text}); its last log lines:\n{launcher.last_words()}")  # fmt: skip
        return text

    def recover(self) -> None:
        """After a failed config: idle the load, unload, and restart the worker if it died."""
        if self.client is not None:
            try:
                self.client.quiesce(10)
            except (OSError, ConnectionError, EOFError):
                self.client.close()
                self.client, self.payload_key = None, None
        if self.launcher is not None and not self.launcher.alive():
            self.loaded = None
            return  # restarted lazily by the next measurement
        self.unload_variant()

    def unload_variant(self) -> None:
        if self.loaded is None or self.launcher is None:
            return
        if self.client is not None:
            self.client.quiesce(30)
        try:
            self.launcher.unload(self.loaded_as)
        except LaunchError:
            pass  # a worker that cannot unload is restarted by the next load if it died
        self.loaded = None
        self.payload_key = None
        if self.fresh_worker_per_variant:
            self.launcher.stop()  # started again, clean, by the next measurement

    def _shutdown(self) -> None:
        for sampler in self.samplers.values():
            sampler.stop()
        if self.client is not None:
            self.client.close()
            self.client = None
        if self.launcher is not None:
            self.launcher.stop()
