"""The profile loop: ask the search for a trial, make and load the variant, measure, store, tell.

One worker and one load generator serve the whole run (worker_session.py): variants are loaded
into the running worker through the repository API (each variant's instances are created fresh on
load and destroyed on unload, so nothing of the previous variant stays), and the load generator's
processes and connections move from variant to variant. The worker is restarted when it died, and
between variants when a memory metric is an objective or constraint (allocators keep freed memory).
The settings are turned into the search, the load and the CPU sets in profile_setup.py.
Every point goes to the checkpoint the moment it is measured; a rerun replays the search from it
and measures only what is missing (no worker is even started when nothing is).
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable

from analyzer.config.model_config import ModelConfig, format_model_config
from analyzer.config.profile_config import ProfileConfig
from analyzer.errors import AnalyzerError
from analyzer.final_comparison import LoadLevels, calibrate_default, run_final_comparison
from analyzer.launch.base import Launcher, LaunchError, LaunchSetupError
from analyzer.launch.cpus import pinned
from analyzer.loadgen.control import ServerError
from analyzer.loadgen.inputs import InputError
from analyzer.loadgen.measure import MeasurementError
from analyzer.loadgen.perf import PerfOptions
from analyzer.metrics import MEMORY_TAGS, base_tag
from analyzer.monitor.metrics_gpu import MetricsGpuSampler
from analyzer.profile_setup import (
    check_folders,
    check_objectives,
    cpu_placement,
    measure_options,
    prepare_output,
    search_limits,
    search_strategy,
)
from analyzer.repository.doctor import check_repository, missing_model_hint
from analyzer.repository.repository import (
    ENSEMBLE,
    ModelSource,
    RepositoryError,
    composing_models,
    files_digest,
    list_models,
    read_model,
)
from analyzer.repository.variants import (
    VariantError,
    composed_variant,
    default_variant,
    describe,
    describe_composed,
    make_variant,
    serve_as,
    write_variant,
)
from analyzer.results.checkpoint import Checkpoint, config_key, point_key
from analyzer.results.measurement import Measurement, from_shared
from analyzer.results.outcome import ModelOutcome, ProfileOutcome
from analyzer.results.ranking import ConfigResult, Ranker, recommended_first
from analyzer.results.together import SEPARATOR, joint_spec
from analyzer.search.base import Outcome, SearchPoint, SearchStrategy
from analyzer.search.brute import BruteSearch
from analyzer.search.composed import ComposedQuickSearch, Part
from analyzer.search.ledger import SharedPoint, unmerged
from analyzer.search.space import SearchSpace, load_levels, load_search_space
from analyzer.worker.devices import gpu_count
from analyzer.worker_session import Listener, WorkerSession

# an ensemble variant's composing models: model name -> (variant folder name, its config)
Composed = dict[str, tuple[str, ModelConfig]]


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
        self.outcome = ProfileOutcome(config, [])
        # the worker, the load generator and the monitors, shared with the final comparison
        self.session = WorkerSession(config, self.outcome, self.listener)
        # an ensemble's composing models (name -> source, in step order), per ensemble profiled
        self.parts: dict[str, dict[str, ModelSource]] = {}
        # per composing model: its variants' config text -> folder name (one folder per config)
        self.part_names: dict[str, dict[str, str]] = {}
        self.bls_models: set[str] = set()  # profiled models whose parts are BLS composing models

    # ---- run ------------------------------------------------------------------------------------
    def run(self) -> ProfileOutcome:
        started = time.monotonic()
        check_objectives(self.config)
        held = list_models(self.config.model_repository)  # a missing repository ends it here
        for spec in self.config.models:  # a misspelt name, before anything is written or emptied
            if spec.name not in held:
                raise RepositoryError(f"profile_models names '{spec.name}', which has no folder "
                                      f"in '{self.config.model_repository}'; "
                                      f"{missing_model_hint(spec.name, held)}")  # fmt: skip
        space = load_search_space(self.config.search_space)
        placement = self.session.placement = cpu_placement(self.config)  # before the launcher
        self.outcome.placement = placement.to_dict()
        if self.config.triton_launch_mode in ("remote", "docker"):
            # bad endpoints, no daemon or no image: one error before anything is written
            self.ensure_launcher().check()
        check_folders(self.config)
        checkpoint = Checkpoint(self.config.checkpoints)
        output = prepare_output(self.config, checkpoint)
        self.listener("placement", {"how": placement.how})
        try:
            with pinned(placement.client):  # the shards it starts inherit the set
                self._profile_models(checkpoint, space)
        finally:
            self.session.shutdown()
            output.release()
        for model in self.outcome.models:
            ranker = Ranker(model.spec.objectives, model.spec.constraints, model.pareto)
            model.results = recommended_first(ranker.rank(model.results), model.comparison)
            if model.results and model.results[0].serve_first:
                # a BLS model calls its composing models by name: the output repository
                # serves the recommended variant's under those names
                for name, variant in model.results[0].serve_first:
                    serve_as(self.config.output_repository, variant, name)
        self.outcome.wall_s = time.monotonic() - started
        return self.outcome

    def _profile_models(self, checkpoint: Checkpoint, space: SearchSpace) -> None:
        remote = self.config.triton_launch_mode == "remote"
        server_gpus = 0
        if remote:  # the server's GPUs, from its metrics
            server_gpus = MetricsGpuSampler(self.config.triton_metrics_url).available()
            use_gpu = server_gpus and not self.config.cpu_only
        else:
            use_gpu = gpu_count() > 0 and not self.config.cpu_only
        self.outcome.kind = "GPU" if use_gpu else "CPU"
        c = self.config
        if c.run_config_profile_models_concurrently_enable and len(c.models) > 1:
            self._profile_together(checkpoint, space, use_gpu, server_gpus if remote
                                   else gpu_count())  # fmt: skip
            return
        for spec in self.config.models:
            model = ModelOutcome(spec)
            self.outcome.models.append(model)
            if not self._healthy(model, server_gpus if remote else gpu_count()):
                continue
            try:
                source = read_model(self.config.model_repository, spec.name)
            except RepositoryError as err:
                model.error = str(err)
                self.listener("model_failed", {"model": spec.name, "error": model.error})
                continue
            bls = bool(self.config.bls_composing_models)
            if (source.backend == ENSEMBLE or bls) and not self._read_parts(model, source, bls):
                continue
            self._profile_model(model, source, space, checkpoint, use_gpu)
            self.listener("model_done", {"model": spec.name})

    def _healthy(self, model: ModelOutcome, gpus: int) -> bool:
        """The repository doctor on this model (and the models its ensemble calls): its errors
        fail the model before anything is made or loaded, its warnings are printed."""
        findings = check_repository(self.config.model_repository, [model.spec.name], gpus)
        for finding in findings:
            if finding.severity == "warning":
                self.listener("repository_note", {"line": finding.line()})
        errors = [f.line() for f in findings if f.severity == "error"]
        if errors:
            model.error = "\n".join(errors)
            self.listener("model_failed", {"model": model.spec.name, "error": model.error})
        return not errors

    def _read_parts(self, model: ModelOutcome, source: ModelSource, bls: bool) -> bool:
        """The composing models of an ensemble (its steps) or of a BLS model
        (--bls-composing-models), read from the repository: the search turns their knobs too.
        False, with the model's error set, when one cannot be used."""
        kind = "BLS model" if bls else "ensemble"
        names = list(self.config.bls_composing_models or []) if bls else (
            composing_models(source.config))  # fmt: skip
        if self.config.triton_launch_mode == "remote":
            model.error = (f"{kind} '{source.name}': profiling it with its composing models "
                           "needs a worker that serves the output model repository "
                           "(triton_launch_mode local or docker), not remote")  # fmt: skip
        elif bls and source.backend == ENSEMBLE:
            model.error = (f"--bls-composing-models is for a python model that calls others, "
                           f"but '{source.name}' is an ensemble (its steps name its models)")
        elif source.name in names:
            model.error = f"{kind} '{source.name}' cannot be one of its own composing models"
        else:
            try:
                self.parts[source.name] = {
                    name: read_model(self.config.model_repository, name) for name in names}
            except RepositoryError as err:
                model.error = f"{kind} '{source.name}': {err}"
            nested = [n for n, part in self.parts.get(source.name, {}).items()
                      if part.backend == ENSEMBLE]  # fmt: skip
            if nested and not model.error:  # its variants were written without steps, then failed
                model.error = (f"{kind} '{source.name}' calls ensemble '{nested[0]}': an ensemble "
                               "of ensembles is not profiled with its composing models; profile "
                               f"'{nested[0]}' itself")  # fmt: skip
            if bls:
                self.bls_models.add(source.name)
        if model.error:
            self.listener("model_failed", {"model": source.name, "error": model.error})
            return False
        return True

    def _profile_model(
        self, model: ModelOutcome, source: ModelSource, space: SearchSpace, checkpoint: Checkpoint,
        use_gpu: bool,
    ) -> None:  # fmt: skip
        spec = model.spec
        cpu_only = spec.cpu_only or not use_gpu
        try:
            settings, options = measure_options(self.config, spec)
        except (AnalyzerError, ValueError) as err:  # InputError among them
            model.error = f"model '{spec.name}': {err}"
            self.listener("model_failed", {"model": spec.name, "error": model.error})
            return
        digest = files_digest(source.path) + "".join(
            files_digest(part.path) for part in self.parts.get(source.name, {}).values())
        fingerprint = [spec.name, digest, options.protocol,
                       options.input_data, options.distribution, sorted(options.shapes.items()),
                       options.string_length, settings.mode, settings.window_ms,
                       settings.request_count, settings.stability_pct, settings.max_trials,
                       settings.percentile, spec.batch_sizes]  # fmt: skip
        if source.config.HasField("sequence_batching"):  # how its sequences are sent
            fingerprint.append(list(dataclasses.astuple(options.sequence)))
        if options.streaming:
            fingerprint.append("streaming")
        # Unloading frees a variant's instances, but allocators keep some memory (torch's CUDA
        # cache, glibc arenas): when memory is ranked on, each variant gets a fresh worker.
        self.session.fresh_worker_per_variant = bool(
            MEMORY_TAGS & (set(spec.objectives) | set(spec.constraints)))  # fmt: skip
        search = search_strategy(self.config, spec, source, space,
                                 json.dumps(fingerprint[:1] + fingerprint[2:]), model,
                                 self.parts.get(source.name))  # fmt: skip
        variants: dict[str, ConfigResult | None] = {}
        try:
            self._search(model, source, search, variants, cpu_only, fingerprint, checkpoint,
                         options)
        finally:
            search.close()
        self._merge_shared(model, source, search.shared_points(), variants, cpu_only)
        if not model.error:
            load, values, sweep = load_levels(space, search_limits(self.config, spec, source))
            levels = LoadLevels(load, values, sweep.plateau_min_gain if sweep else 0.05)
            run_final_comparison(self, model, options, checkpoint, json.dumps(fingerprint),
                                 levels)  # fmt: skip

    def _search(
        self, model: ModelOutcome, source: ModelSource | None, search: SearchStrategy,
        variants: dict[str, ConfigResult | None], cpu_only: bool, fingerprint: list,
        checkpoint: Checkpoint, options: PerfOptions,
        new_variant: Callable[[SearchPoint], ConfigResult | None] | None = None,
    ) -> None:  # fmt: skip
        """The search's trials measured in turn; `new_variant` makes a trial's config (the
        model's own variants when None; `source` is then the model's)."""
        spec = model.spec
        ranker = Ranker(spec.objectives, spec.constraints)
        current: ConfigResult | None = None
        fingerprint_text = json.dumps(fingerprint)
        if new_variant is None:
            assert source is not None

            def new_variant(trial: SearchPoint) -> ConfigResult | None:
                return self._new_variant(model, source, trial, cpu_only)

        while (trial := search.ask()) is not None:
            if trial.params_json not in variants:
                variants[trial.params_json] = new_variant(trial)
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
            same = next((m for m in result.measurements if (m.load, m.value, m.batch_size)
                         == (trial.load, trial.value, trial.batch_size)), None)  # fmt: skip
            if same is not None:  # two search params named this config: measured once
                search.tell(trial, _outcome(ranker, result, same, ranker.violations(same)))
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
                    is None and not self.session.fresh_worker_per_variant):  # fmt: skip
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

    def _new_variant(
        self, model: ModelOutcome, source: ModelSource, trial: SearchPoint, cpu_only: bool
    ) -> ConfigResult | None:
        params = trial.params
        parts = self.parts.get(source.name)
        try:
            if parts is not None:
                config, own, composing = self._composed(source, parts, params, cpu_only)
            else:
                config = _variant_config(source.config, params, cpu_only)
        except VariantError as err:
            model.skipped.append(f"{json.dumps(params, sort_keys=True)}: {err}")
            return None
        text = (format_model_config(_unnamed(config)) if parts is None
                else _composed_text(own, composing))  # fmt: skip
        same = next((r for r in model.results if r.config_text == text), None)
        if same is not None:  # e.g. the quick search's first state, often the model's own config
            return same
        index = sum(1 for r in model.results if not r.is_default)
        name = f"{source.name}_config_{'default' if not params else index}"
        folder = self.config.output_repository / name
        write_variant(source.path, config, folder)
        named = ModelConfig()
        named.CopyFrom(config)
        named.name = name
        description = describe(config)
        serve_first: list[tuple[str, str]] = []
        if parts is not None:
            shown = dict(composing)
            if source.name in self.bls_models:  # the BLS model's own values first
                shown = {source.name: (name, config), **composing}
                serve_first = [(part, variant) for part, (variant, _) in composing.items()]
            description = describe_composed(shown, [v for v, _ in composing.values()])
        result = ConfigResult(
            model=source.name,
            name=name,
            params=params,
            description=description,
            config_text=text,
            path=str(folder),
            is_default=not params,
            serve_first=serve_first,
        )
        result.description["config_pbtxt"] = format_model_config(named)
        model.results.append(result)
        self.listener("variant", {"result": result})
        return result

    # ---- models profiled together ----------------------------------------------------------------
    def _profile_together(self, checkpoint: Checkpoint, space: SearchSpace, use_gpu: bool,
                          gpus: int) -> None:  # fmt: skip
        """MA's run_config_profile_models_concurrently_enable: one search over every model's
        knobs, each trial a variant of every model loaded at once and measured side by side
        (results/together.py), ranked by each model's objectives weighted by its weighting."""
        specs = self.config.models
        model = ModelOutcome(joint_spec(specs))
        self.outcome.models.append(model)
        sources: dict[str, ModelSource] = {}
        options: dict[str, PerfOptions] = {}
        for spec in specs:
            alone = ModelOutcome(spec)
            if not self._healthy(alone, gpus):
                model.error = alone.error
                return
            try:
                sources[spec.name] = source = read_model(self.config.model_repository, spec.name)
                options[spec.name] = measure_options(self.config, spec)[1]
            except (AnalyzerError, ValueError) as err:  # RepositoryError, InputError among them
                model.error = f"model '{spec.name}': {err}"
            else:
                if source.backend == ENSEMBLE or self.config.bls_composing_models:
                    model.error = (f"model '{spec.name}': an ensemble or BLS model is not "
                                   "profiled together with others (nor is it in MA); profile it "
                                   "on its own, without run_config_profile_models_concurrently"
                                   "_enable")  # fmt: skip
            if model.error:
                self.listener("model_failed", {"model": model.spec.name, "error": model.error})
                return
        first = options[specs[0].name]
        self.session.together_options = options
        self.session.fresh_worker_per_variant = bool(MEMORY_TAGS & {
            base_tag(t) for t in [*model.spec.objectives, *model.spec.constraints]})
        fingerprint: list = [model.spec.name, first.settings.mode, first.settings.window_ms,
                             first.settings.request_count, first.settings.stability_pct,
                             first.settings.max_trials, first.settings.percentile,
                             model.spec.batch_sizes, "together"]  # fmt: skip
        for spec in specs:
            own = options[spec.name]
            fingerprint += [spec.name, files_digest(sources[spec.name].path), own.protocol,
                            own.input_data, own.distribution, sorted(own.shapes.items()),
                            own.string_length, spec.weighting]  # fmt: skip
        if any(s.config.HasField("sequence_batching") for s in sources.values()):
            space = dataclasses.replace(space, queue_delays_us=space.queue_delays_us[:1])
        limits = dataclasses.replace(
            search_limits(self.config, specs[0], sources[specs[0].name]), manual={},
            own_max_batch_size=max(s.config.max_batch_size for s in sources.values()))
        search: SearchStrategy = (
            BruteSearch(space, limits, top_configs=self.config.num_configs_per_model)
            if limits.search_disable else ComposedQuickSearch(
                space, limits, [Part(n, s.config.max_batch_size) for n, s in sources.items()],
                top_configs=self.config.num_configs_per_model))  # fmt: skip
        cpu_only = {spec.name: spec.cpu_only or not use_gpu for spec in specs}
        variants: dict[str, ConfigResult | None] = {}
        try:
            self._search(model, None, search, variants, all(cpu_only.values()), fingerprint,
                         checkpoint, first,
                         lambda trial: self._joint_variant(model, sources, trial, cpu_only))
        finally:
            search.close()
        if not model.error:
            load, values, sweep = load_levels(space, limits)
            levels = LoadLevels(load, values, sweep.plateau_min_gain if sweep else 0.05)
            run_final_comparison(self, model, first, checkpoint, json.dumps(fingerprint), levels)
        self.listener("model_done", {"model": model.spec.name})

    def _joint_variant(
        self, model: ModelOutcome, sources: dict[str, ModelSource], trial: SearchPoint,
        cpu_only: dict[str, bool],
    ) -> ConfigResult | None:  # fmt: skip
        """A trial of models profiled together: each model's variant written once as its own
        folder (`add_sub_config_3`), the joint config naming them all."""
        params = trial.params
        parts: Composed = {}
        together: list[tuple[str, str, str]] = []
        for name, source in sources.items():
            asked = params.get(name) or {}
            try:
                config = _variant_config(source.config, asked, cpu_only[name])
            except VariantError as err:
                model.skipped.append(f"{json.dumps(params, sort_keys=True)}: {name}: {err}")
                return None
            variant = self._part_variant(name, source, config, bool(asked))
            parts[name] = (variant, config)
            together.append((name, variant, format_model_config(_unnamed(config))))
        identity = "".join(f"# model {name}\n{text}" for name, _, text in together)
        same = next((r for r in model.results if r.config_text == identity), None)
        if same is not None:
            return same
        result = ConfigResult(
            model=model.spec.name, name=SEPARATOR.join(variant for _, variant, _ in together),
            params=params, description=describe_composed(parts, [v for _, v, _ in together]),
            config_text=identity, path=str(self.config.output_repository),
            is_default=not params, together=together,
        )  # fmt: skip
        result.description["config_pbtxt"] = "".join(
            f"# {variant}\n{text}" for _, variant, text in together)
        model.results.append(result)
        self.listener("variant", {"result": result})
        return result

    def _part_variant(self, name: str, source: ModelSource, config: ModelConfig,
                      asked: bool) -> str:  # fmt: skip
        """The folder of one composing (or jointly profiled) model's variant, written once per
        distinct config: `add_sub_config_3`, or `add_sub_config_default` for its own config."""
        names = self.part_names.setdefault(name, {})
        key = format_model_config(_unnamed(config))
        if key not in names:
            made = sum(1 for n in names.values() if not n.endswith("_config_default"))
            names[key] = variant = f"{name}_config_{made if asked else 'default'}"
            write_variant(source.path, config, self.config.output_repository / variant)
        return names[key]

    def _composed(self, source: ModelSource, parts: dict[str, ModelSource], params: dict,
                  cpu_only: bool) -> tuple[ModelConfig, ModelConfig, Composed]:  # fmt: skip
        """A variant with composing models: each composing model's variant written once as its
        own folder (`add_sub_config_3`). An ensemble's config gets its steps calling those
        folders, so each ensemble variant serves with its composing variants as they are; a BLS
        model's config is its own variant (its code calls the models by their own names).
        Returns (the config to write, the model's own config for the variant's identity, the
        composing variants)."""
        cpu_parts = set(self.config.cpu_only_composing_models or [])
        composing: Composed = {}
        for part, part_source in parts.items():
            asked = params.get(part) or {}
            config = _variant_config(part_source.config, asked, cpu_only or part in cpu_parts)
            composing[part] = (self._part_variant(part, part_source, config, bool(asked)),
                               config)  # fmt: skip
        if source.name in self.bls_models:
            config = _variant_config(source.config, params.get(source.name) or {}, cpu_only)
            return config, config, composing
        return composed_variant(source.config, composing), source.config, composing

    # ---- the worker session, as the final comparison uses it -----------------------------------
    def ensure_launcher(self) -> Launcher:
        return self.session.ensure_launcher()

    def measure_point(
        self, result: ConfigResult, trial: SearchPoint, options: PerfOptions
    ) -> Measurement:
        """One point of a loaded (or now loaded) variant (see WorkerSession.measure_point)."""
        return self.session.measure_point(result, trial, options)

    def failure_text(self, err: Exception) -> str:
        return self.session.failure_text(err)

    def recover(self) -> None:
        """After a failed config: idle the load, unload, and restart the worker if it died."""
        self.session.recover()

    def unload_variant(self) -> None:
        self.session.unload_variant()


def _variant_config(config: ModelConfig, params: dict, cpu_only: bool) -> ModelConfig:
    """The model's config with `params` set; its own (made servable here) without any."""
    return make_variant(config, params, cpu_only) if params else default_variant(config, cpu_only)


def _composed_text(ensemble: ModelConfig, composing: Composed) -> str:
    """The identity of an ensemble variant: its composing configs, not their folders' names."""
    return format_model_config(_unnamed(ensemble)) + "".join(
        f"# composing model {part}\n{format_model_config(_unnamed(cfg))}"
        for part, (_, cfg) in composing.items())  # fmt: skip


def _unnamed(config: ModelConfig) -> ModelConfig:
    out = ModelConfig()
    out.CopyFrom(config)
    out.name = ""
    return out
