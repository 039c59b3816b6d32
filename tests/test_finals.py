"""The final comparison's statistics: intervals, paired ties, the cheapest of the tied, orders."""

from __future__ import annotations

import math

import pytest

from analyzer.config.profile_config import ProfileConfigError, load_profile_config
from analyzer.final_comparison import RoundPlan, _plan, pool_band
from analyzer.results.finals import (
    Calibration,
    Comparison,
    FinalResult,
    calibrate,
    mark_ties,
    mean_interval,
    ratio_interval,
    round_order,
    rounds_for_noise,
    summarize,
)
from analyzer.results.measurement import Measurement
from analyzer.results.ranking import ConfigResult, Ranker, recommended_first


def point(name: str, throughput: float, p99: float = 5.0, memory: float = 100.0) -> Measurement:
    return Measurement(model="m", config_name=name, load="concurrency", value=4, batch_size=1,
                       metrics={"perf_throughput": throughput, "perf_latency_p99": p99,
                                "cpu_used_ram": memory})  # fmt: skip


def result(name: str, instances: int, max_batch: int, search: list[float]) -> ConfigResult:
    return ConfigResult(
        model="m", name=name, params={"n": name}, config_text="", path="",
        description={"instance_count": instances, "max_batch_size": max_batch,
                     "instance_group": f"{instances}:CPU", "max_queue_delay_us": None},
        measurements=[point(name, t) for t in search], is_default=name == "default",
    )  # fmt: skip


def test_mean_interval_is_student_t():
    values = [10.0, 12.0, 11.0, 13.0, 9.0]
    got = mean_interval(values)
    half = 2.776 * math.sqrt(2.5) / math.sqrt(5)  # t(4) = 2.776, sample sd = sqrt(2.5)
    assert got.estimate == pytest.approx(11.0)
    assert (got.low, got.high) == pytest.approx((11.0 - half, 11.0 + half))


def test_paired_ratio_cancels_drift_between_rounds():
    # the machine halves its speed between rounds: both configs move together, b is 10% faster
    a = [1000.0, 500.0, 1000.0, 500.0, 800.0]
    b = [x * 1.1 for x in a]
    got = ratio_interval(b, a)
    assert got.estimate == pytest.approx(1.1)
    assert got.low == pytest.approx(1.1) and got.high == pytest.approx(1.1)
    # unpaired, the same numbers overlap completely
    assert mean_interval(a).high > mean_interval(b).low


def test_ties_are_decided_by_paired_differences():
    ranker = Ranker({"perf_throughput": 1.0}, {})
    drift = [1.0, 0.6, 1.0, 0.7, 0.9]
    leader = [point("lead", 1000 * d) for d in drift]
    clear = [point("slow", 900 * d) for d in drift]  # 10% slower every round
    noisy = [point("close", 1000 * d * f) for d, f in zip(drift, [1.02, 0.97, 1.01, 0.98, 1.0],
                                                            strict=True)]  # fmt: skip
    finals = {"lead": summarize(leader), "slow": summarize(clear), "close": summarize(noisy)}
    tied = mark_ties(finals, "lead", ranker.score)
    assert tied == ["lead", "close"]
    assert finals["close"].tied and not finals["slow"].tied
    assert finals["slow"].vs_leader.high < 0


def test_rounds_change_order_and_every_config_leads_once():
    orders = [round_order(["a", "b", "c"], i) for i in range(6)]
    assert all(sorted(o) == ["a", "b", "c"] for o in orders)
    assert {o[0] for o in orders} == {"a", "b", "c"}
    assert len({tuple(o) for o in orders}) == 6


def test_final_rounds_replace_search_points_and_the_cheapest_tied_is_recommended():
    ranker = Ranker({"perf_throughput": 1.0}, {})
    big = result("big", 2, 8, [1500.0])  # a lucky search point
    small = result("small", 1, 8, [1200.0])
    default = result("default", 1, 32, [700.0])
    other = result("other", 1, 4, [1100.0])  # not a finalist: its search point stays
    drift = [1.0, 0.8, 1.0, 0.9, 1.0]
    big.final = summarize([point("big", 1000 * d * f) for d, f in
                           zip(drift, [1.01, 0.99, 1.0, 1.02, 0.98], strict=True)])  # fmt: skip
    small.final = summarize([point("small", 1000 * d * f) for d, f in
                             zip(drift, [0.99, 1.0, 1.01, 0.98, 1.0], strict=True)])  # fmt: skip
    default.final = summarize([point("default", 600 * d) for d in drift])
    ranked = ranker.rank([default, other, small, big])
    assert [r.name for r in ranked][:3] == ["big", "small", "default"]  # finalists first
    assert ranked[0].best is big.final.combined
    finals = {r.name: r.final for r in (big, small, default)}
    tied = mark_ties(finals, "big", ranker.score)
    assert tied == ["big", "small"]
    comparison = Comparison(5, list(finals), leader="big", recommended="small", tied=tied)
    ordered = recommended_first(ranked, comparison)
    assert [r.name for r in ordered][:2] == ["small", "big"] and ordered[0].rank == 1


def test_results_round_trip():
    final = summarize([point("a", t) for t in (900.0, 1000.0, 1100.0)])
    final.tied = True
    again = FinalResult.from_dict(final.to_dict())
    assert again.throughput == final.throughput and again.tied
    comparison = Comparison(3, ["a", "b"], points=6, leader="a", recommended="a", tied=["a"],
                            vs_default=ratio_interval([2.0, 2.2], [1.0, 1.0]))  # fmt: skip
    assert Comparison.from_dict(comparison.to_dict()) == comparison


def test_final_rounds_setting_is_checked(tmp_path):
    with pytest.raises(ProfileConfigError, match="final_rounds"):
        load_profile_config(["--model-repository", str(tmp_path), "--profile-models", "m",
                             "--final-rounds", "1"])  # fmt: skip


def test_the_calibration_sets_the_rounds_within_the_budget():
    assert rounds_for_noise(0.0) == 3
    assert rounds_for_noise(0.02) == 4  # a quiet machine: 2% per window
    assert rounds_for_noise(0.10) == 10  # this VM: capped
    windows = [point("d", t) for t in (1000.0, 1010.0, 990.0, 1005.0, 995.0)]
    for m in windows:
        m.wall_s = 0.6
    calibration = calibrate(windows)
    assert calibration.noise_pct == pytest.approx(0.79, abs=0.01) and calibration.rounds == 3
    plan = _plan(None, calibration, 100.0)
    assert plan.wanted == 3 and plan.budget == pytest.approx((25.0 - 3.0) / 0.6)  # windows
    assert _plan(7, calibration, 100.0) == RoundPlan(7, None, "as --final-rounds asks")
    assert _plan(None, None, 100.0).wanted == 5
    noisy = Calibration([1.0] * 5, 12.0, 10, 0.6)
    note = _plan(None, noisy, 40.0).note
    assert "asks for 10 rounds" in note
    assert pool_band(calibration) == 0.10 and pool_band(noisy) == 0.25  # 3 x noise, clamped
    comparison = Comparison(4, ["a", "b"], calibration=noisy, rounds_note=note)
    assert Comparison.from_dict(comparison.to_dict()) == comparison


def test_the_cheapest_of_the_tied_needs_a_real_saving_else_the_leader_stays():
    from analyzer.results.finals import cheapest

    one = {"instance_count": 1, "max_batch_size": 16}
    two = {"instance_count": 2, "max_batch_size": 16}
    leader = ("leader", one, point("leader", 1300.0, memory=291.0))
    # same instances and batch size, 3 MB less RSS: noise, not a saving -> the leader stays
    assert cheapest([leader, ("b", one, point("b", 960.0, memory=288.0))]) == ("leader", "")
    # a real saving in memory wins
    name, why = cheapest([leader, ("c", one, point("c", 1200.0, memory=200.0))])
    assert name == "c" and why.startswith("less memory (200 vs 291 MB)")
    # fewer instances come first, whatever the memory
    name, why = cheapest([("leader", two, point("leader", 1300.0, memory=100.0)),
                          ("d", one, point("d", 1250.0, memory=300.0))])  # fmt: skip
    assert name == "d" and why == "fewer instances (1 vs 2)"
    # then a smaller max batch size
    small = {"instance_count": 1, "max_batch_size": 8}
    name, why = cheapest([leader, ("e", small, point("e", 1250.0, memory=295.0))])
    assert name == "e" and why == "a smaller max batch size (8 vs 16)"
    # not a shorter queue delay: configs tied on throughput and equal in cost keep the leader
    slow = {"instance_count": 1, "max_batch_size": 16, "max_queue_delay_us": 1000}
    quick = {"instance_count": 1, "max_batch_size": 16, "max_queue_delay_us": 200}
    assert cheapest([("leader", slow, point("leader", 3855.0, memory=290.0)),
                     ("f", quick, point("f", 3799.0, memory=292.0))]) == ("leader", "")


def test_a_round_without_a_memory_sample_makes_no_config_cheaper():
    """Seen in a brute run: one of ten 0.3-s rounds had no RSS sample; the config's combined
    memory became unknown, was read as 0 MB, and the tie rule called it "less memory (0 vs 381
    MB)". A round without a sample now says nothing of memory, and unknown memory is never
    less."""
    from analyzer.results.finals import cheapest, combine

    rounds = [point("b", 3900.0, memory=383.0) for _ in range(3)]
    del rounds[1].metrics["cpu_used_ram"]
    assert combine(rounds).metrics["cpu_used_ram"] == 383.0
    one = {"instance_count": 1, "max_batch_size": 8}
    unread = point("c", 3880.0)
    del unread.metrics["cpu_used_ram"]
    leader = ("leader", one, point("leader", 3925.0, memory=381.0))
    assert cheapest([leader, ("c", one, unread)]) == ("leader", "")
    smaller = {"instance_count": 1, "max_batch_size": 4}
    assert cheapest([leader, ("c", smaller, unread)]) == ("c", "a smaller max batch size (4 vs 8)")


class _FakeProfiler:
    """Just what the final comparison drives: a model whose throughput and p99 at each load are
    given, measured without noise, and a checkpoint that a second run reads back."""

    def __init__(self, curves: dict[str, dict[int, tuple[float, float]]], rounds: int) -> None:
        from types import SimpleNamespace

        self.curves = curves
        self.measured: list[tuple[str, int]] = []
        self.config = SimpleNamespace(num_configs_per_model=2, final_rounds=rounds)
        self.outcome = SimpleNamespace(worker_starts=1)
        self.session = SimpleNamespace(
            fresh_worker_per_variant=False, loaded_as="", mark_loaded=lambda name: None,
            unload_all=lambda names: None)  # fmt: skip
        self.listener = lambda event, data: None

    def ensure_launcher(self):
        from types import SimpleNamespace

        return SimpleNamespace(remote=False)

    def measure_point(self, result, trial, options) -> Measurement:
        self.measured.append((result.name, trial.value))
        self.session.loaded_as = result.name
        throughput, p99 = self.curves[result.name][trial.value]
        m = point(result.name, throughput, p99)
        m.value, m.wall_s = trial.value, 0.5
        return m


def _searched(name: str, curve: dict[int, tuple[float, float]], best: int) -> ConfigResult:
    """A config whose search measured the loads up to `best` (the best one last)."""
    r = result(name, 1, 8, [])
    r.config_text = f'name: "{name}"'  # the checkpoint's keys tell configs apart by their text
    for value in sorted(v for v in curve if v <= best):
        m = point(name, *curve[value])
        m.value = value
        r.measurements.append(m)
    return r


def test_a_finalist_whose_search_stopped_a_load_level_short_is_moved_up(tmp_path):
    """The search's best load comes from single noisy points: the first round measures each
    finalist one level up too, and its rounds move there when that gains more than the sweep's
    plateau gain and meets the constraints. Checkpointed: a rerun measures nothing again."""
    from analyzer.config.model_specs import ModelSpec
    from analyzer.final_comparison import LoadLevels, run_final_comparison
    from analyzer.loadgen.perf import PerfOptions
    from analyzer.results.checkpoint import Checkpoint
    from analyzer.results.outcome import ModelOutcome

    curves = {
        "short": {4: (1000.0, 4.0), 8: (1300.0, 6.0), 16: (1320.0, 12.0)},  # stopped at 4
        "flat": {4: (900.0, 4.0), 8: (1200.0, 6.0), 16: (1230.0, 13.0)},  # +2.5%: stays at 8
        "slow": {8: (1250.0, 7.0), 16: (1600.0, 30.0)},  # faster at 16, but breaks p99 <= 20
        "default": {16: (600.0, 25.0)},  # the top level: nothing above it
    }
    spec = ModelSpec("m", objectives={"perf_throughput": 1.0},
                     constraints={"perf_latency_p99": {"max": 20.0}})  # fmt: skip
    levels = LoadLevels("concurrency", [1, 2, 4, 8, 16], 0.05)

    def run(directory) -> tuple[_FakeProfiler, ModelOutcome]:
        profiler = _FakeProfiler(curves, rounds=3)
        profiler.config.num_configs_per_model = 3
        model = ModelOutcome(spec, [_searched("short", curves["short"], 4),
                                    _searched("flat", curves["flat"], 8),
                                    _searched("slow", curves["slow"], 8),
                                    _searched("default", curves["default"], 16)])  # fmt: skip
        model.results[-1].is_default = True
        Ranker(spec.objectives, spec.constraints).rank(model.results)
        run_final_comparison(profiler, model, PerfOptions(model="m"), Checkpoint(directory),
                             "fp", levels)  # fmt: skip
        return profiler, model

    profiler, model = run(tmp_path)
    c = model.comparison
    assert c is not None and c.moved == ["short"]
    assert set(c.load_checks) == {"short", "flat", "slow"}  # the default is at the top level
    assert "stays (not 5% better)" in c.load_checks["flat"]
    assert "stays (perf_latency_p99 30 ms > max 20)" in c.load_checks["slow"]
    by_name = {r.name: r for r in model.results}
    assert [m.value for m in by_name["short"].final.rounds] == [8, 8, 8]  # the check is round 1
    assert [m.value for m in by_name["flat"].final.rounds] == [8, 8, 8]
    assert profiler.measured.count(("short", 4)) == 1 and profiler.measured.count(("short", 8)) == 3
    assert c.points == len(profiler.measured) == 3 * 4 + 3  # 3 rounds of 4 and 3 checks
    assert c.leader == "short"  # 1300 at its new load against slow's 1250
    from analyzer.report.console import how_sure

    assert ("measured one load level up in the first round; moved up: short (concurrency 4 -> "
            "8: 1000.0 -> 1300.0 infer/s") in how_sure(c)  # fmt: skip
    assert Comparison.from_dict(c.to_dict()) == c
    again, model = run(tmp_path)  # the same checkpoint: every point is read back
    assert again.measured == [] and model.comparison.moved == ["short"]


def test_a_cheaper_tied_config_replaces_the_leader_only_when_shown_within_five_percent():
    """Noisy rounds tie configs 3% and 10% behind the leader: neither is recommended for a smaller
    max batch size. One whose rounds show it at most 5% behind (a non-inferiority margin) is."""
    from analyzer.final_comparison import _conclude

    ranker = Ranker({"perf_throughput": 1.0}, {})
    base = [1000.0, 700.0, 1250.0, 900.0, 1100.0]
    cases = [
        ([0.90 * t for t in (1250.0, 700.0, 1000.0, 1100.0, 900.0)], "leader"),  # 10% behind
        ([0.97 * t for t in (1250.0, 700.0, 1000.0, 1100.0, 900.0)], "leader"),  # 3%, noisy
        ([t * (1 + d) for t, d in zip(base, (-0.02, 0.0, -0.01, 0.01, -0.01), strict=True)],
         "small"),  # 0.6% behind, the interval of the difference within -2.0%..+0.8%
    ]  # fmt: skip
    for rounds, recommended in cases:
        leader, small = result("leader", 1, 16, []), result("small", 1, 8, [])
        leader.final = summarize([point("leader", t) for t in base])
        small.final = summarize([point("small", t) for t in rounds])
        results = [leader, small]
        ranker.rank(results)
        finals = {r.name: r.final for r in results}
        comparison = Comparison(5, list(finals))
        _conclude(comparison, ranker, {r.name: r for r in results}, finals, None)
        assert comparison.tied == ["leader", "small"], rounds
        assert comparison.recommended == recommended, rounds
        if recommended == "small":
            assert comparison.why.endswith("a smaller max batch size (8 vs 16); it is recommended")


def test_a_finalist_that_left_the_race_is_not_recommended_even_if_cheaper_and_tied():
    """Seen in a brute run (20 rounds): a cheaper config left the race after 5 rounds, behind
    the leader of the time; over those rounds it tied the final leader, and the tie rule
    recommended it, whose 5 rounds against the default's 20 broke the paired ratio. A finalist
    that left the race is not recommended; the ratio pairs the rounds both ran."""
    from analyzer.final_comparison import _conclude

    ranker = Ranker({"perf_throughput": 1.0}, {})
    base = [1000.0, 700.0, 1250.0, 900.0, 1100.0, 950.0, 1050.0]
    leader, left = result("leader", 1, 16, []), result("left", 1, 8, [])
    default = result("default", 1, 32, [])
    leader.final = summarize([point("leader", t) for t in base])
    wobble = (1.01, 0.99, 1.0, 1.005, 0.995)
    left.final = summarize([point("left", t * w) for t, w in zip(base, wobble, strict=False)])
    default.final = summarize([point("default", t / 2) for t in base])
    results = [leader, left, default]
    ranker.rank(results)
    finals = {r.name: r.final for r in results}
    comparison = Comparison(7, list(finals), eliminated={"left": "behind x after 5 rounds"})
    _conclude(comparison, ranker, {r.name: r for r in results}, finals, default)
    assert "left" in comparison.tied and comparison.recommended == "leader"
    assert comparison.vs_default is not None
    assert comparison.vs_default.estimate == pytest.approx(2.0)
    # still racing, the same config is cheaper by its smaller max batch and is recommended
    comparison = Comparison(7, list(finals))
    _conclude(comparison, ranker, {r.name: r for r in results}, finals, default)
    assert comparison.recommended == "left"
    assert comparison.why.endswith("a smaller max batch size (8 vs 16); it is recommended")
    assert comparison.vs_default is not None  # 5 rounds paired with the default's first 5
    assert comparison.vs_default.estimate == pytest.approx(2.0, abs=0.01)


def test_a_finalist_that_left_the_race_early_is_never_the_leader_even_with_the_best_mean():
    """Seen in `make demo`: the machine slowed after the third round, so a finalist that left
    then (behind the leader of its round) had a higher mean over its 3 rounds than the finishers
    over their 7. It became the leader, was not recommendable, and no finalist was left:
    IndexError. The leader is a finisher, and the one that left ranks after the finishers."""
    from analyzer.final_comparison import _conclude

    ranker = Ranker({"perf_throughput": 1.0}, {})
    base = [1000.0, 1010.0, 990.0, 600.0, 610.0, 590.0, 600.0]  # slow from round 4
    leader, left = result("leader", 1, 16, [950.0]), result("left", 1, 8, [940.0])
    default = result("default", 1, 32, [500.0])
    leader.final = summarize([point("leader", t) for t in base])
    left.final = summarize([point("left", t * 0.9) for t in base[:3]])  # 10% behind, 3 rounds
    left.final.left_race = True
    default.final = summarize([point("default", t / 2) for t in base])
    results = [leader, left, default]
    assert left.final.combined.metrics["perf_throughput"] > \
        leader.final.combined.metrics["perf_throughput"]  # fmt: skip
    ranker.rank(results)
    assert left.score > leader.score  # by its mean alone it would lead
    finals = {r.name: r.final for r in results}
    comparison = Comparison(7, list(finals), eliminated={"left": "behind leader after 3 rounds"})
    _conclude(comparison, ranker, {r.name: r for r in results}, finals, default)
    assert comparison.leader == comparison.recommended == "leader"
    assert finals["left"].vs_leader is not None and finals["left"].vs_leader.high < 0.0
    # ranked by its paired difference to the leader (10% behind), not by its mean
    assert [r.name for r in ranker.rank([left, default, leader])] == ["leader", "left", "default"]
    assert FinalResult.from_dict(left.final.to_dict()).left_race


def test_configs_within_the_search_noise_join_the_finalists_and_the_clearly_behind_leave_early(
    tmp_path,
):
    """Brute force's single points placed the true best 4th-6th: the finalists are the search's
    top `num_configs_per_model` plus the configs within its noise band (10% here), and the
    rounds race them: from the third round a finalist shown behind the leader leaves, and the
    rounds go on while one is still tied, within the budget."""
    from analyzer.config.model_specs import ModelSpec
    from analyzer.final_comparison import run_final_comparison
    from analyzer.loadgen.perf import PerfOptions
    from analyzer.report.console import how_sure
    from analyzer.results.checkpoint import Checkpoint
    from analyzer.results.outcome import ModelOutcome

    search = {"a": 1000.0, "b": 980.0, "c": 950.0, "d": 920.0, "e": 850.0, "default": 500.0}
    truth = {"a": 900.0, "b": 990.0, "c": 1000.0, "d": 700.0, "e": 1000.0, "default": 500.0}
    jitter = [1.01, 0.99, 1.0, 1.02, 0.98, 1.0]  # b and c: 1% apart, each round's noise ~1%
    calls: dict[str, int] = {}

    class Noisy(_FakeProfiler):
        def measure_point(self, result, trial, options) -> Measurement:
            m = super().measure_point(result, trial, options)
            n = calls[result.name] = calls.get(result.name, 0) + 1
            factor = jitter[n % len(jitter)] if result.name == "b" else 1.0
            m.metrics["perf_throughput"] = truth[result.name] * factor
            return m

    curves = {name: {16: (t, 5.0)} for name, t in search.items()}
    profiler = Noisy(curves, rounds=None)
    spec = ModelSpec("m", objectives={"perf_throughput": 1.0})
    results = [_searched(name, curves[name], 16) for name in search]
    for r in results:
        r.measurements[0].wall_s = 20.0  # 120 s of search: a budget of 30 s, 60 windows
    results[-1].is_default = True
    model = ModelOutcome(spec, results)
    model.calibration = Calibration([1.0] * 5, 2.0, 6, 0.5)  # asks for 6 rounds
    Ranker(spec.objectives, {}).rank(model.results)
    run_final_comparison(profiler, model, PerfOptions(model="m"), Checkpoint(tmp_path), "fp")
    c = model.comparison
    assert c is not None
    assert c.finalists == ["a", "b", "c", "d", "default"]  # e: 15% below the leader's point
    assert c.pool_note.startswith("Beyond the search's top 2, c, d joined")
    assert set(c.eliminated) == {"a", "b", "d"}
    assert c.eliminated["d"].startswith("behind c by 30.0%")
    assert c.eliminated["d"].endswith("after 3 rounds")
    # b, 1% behind with 1% noise, stays tied for 3 rounds: the race goes on past the 6 rounds the
    # calibration asked for, within the budget, until the rounds tell b from c
    assert c.eliminated["b"].startswith("behind c by 1.1%")
    assert c.eliminated["b"].endswith("after 8 rounds")
    by_name = {r.name: r for r in model.results}
    assert len(by_name["a"].final.rounds) == 3 and len(by_name["c"].final.rounds) == 8
    assert c.rounds == 8 and c.points == 3 * 5 + 5 * 3
    assert "8 ran, while a finalist was still tied with the leader" in c.rounds_note
    assert c.leader == c.recommended == "c" and c.tied == ["c"]
    text = how_sure(c)
    assert "Left the race: a (behind c by 10.0%" in text
    assert "c is ahead of every other finalist beyond noise, but by only 1.1% over b" in text
    assert Comparison.from_dict(c.to_dict()) == c


def test_a_rounds_window_holds_enough_requests_and_no_more():
    from analyzer.final_comparison import round_options, round_window_ms
    from analyzer.loadgen.perf import PerfOptions

    options = PerfOptions(model="m")  # the search's shortest window: 1000 ms
    assert round_window_ms(options, 8000.0) == 200  # 400 requests take 50 ms: the floor
    assert round_window_ms(options, 1000.0) == 400
    assert round_window_ms(options, 100.0) == 500  # half the search's window at most
    assert round_window_ms(options, None) == 500
    settings = round_options(options, 200).settings
    assert (settings.window_ms, settings.min_window_ms, settings.warmup_ms) == (200, 200, 50)
    assert round_options(options, 500).settings.warmup_ms == 125


def test_with_pareto_objectives_a_finalist_is_on_the_front_by_its_rounds():
    """Seen under a loaded machine: the default config, a finalist by rule but off the search's
    front, won the rounds on both objectives and was ranked first while the notes said the front
    was. A finalist's point on the front is the mean of its rounds; a finalist another one's
    rounds beat on both objectives ranks after the front and is not recommended for a tie."""
    from analyzer.final_comparison import _conclude

    pareto = ("perf_throughput", "perf_latency_p99")
    ranker = Ranker({"perf_throughput": 1.0}, {}, pareto=pareto)
    searched = result("searched", 1, 8, [])
    searched.measurements = [point("searched", 6800.0, 1.6)]  # its lucky search point
    default = result("default", 1, 32, [])
    default.measurements = [point("default", 5300.0, 1.9)]  # dominated by that point
    quick = result("quick", 1, 4, [])
    quick.measurements = [point("quick", 4900.0, 1.2)]  # lowest latency, not a finalist
    slow = result("slow", 2, 2, [])
    slow.measurements = [point("slow", 4100.0, 3.1)]  # dominated whichever evidence counts
    base = [8400.0, 7600.0, 8800.0]
    default.final = summarize([point("default", t, 4.4) for t in base])
    searched.final = summarize([point("searched", t / 2, 5.8) for t in base])
    ranked = ranker.rank([searched, default, quick, slow])
    assert [(r.name, r.pareto) for r in ranked] == [
        ("default", True), ("quick", True), ("searched", False), ("slow", False)]
    finals = {r.name: r.final for r in (searched, default)}
    assert ranker.dominated_finalists(finals) == {"searched"}
    comparison = Comparison(3, list(finals))
    _conclude(comparison, ranker, {r.name: r for r in ranked}, finals, default)
    assert comparison.recommended == "default"
    # a cheaper config tied with the leader but beaten on both objectives is not recommended
    leader, cheap = result("leader", 1, 16, []), result("cheap", 1, 8, [])
    leader.final = summarize([point("leader", t, 2.0) for t in base])
    cheap.final = summarize([point("cheap", t * w, 2.5) for t, w in
                             zip(base, (0.999, 0.998, 0.999), strict=True)])  # fmt: skip
    both = [leader, cheap]
    ranker.rank(both)
    finals = {r.name: r.final for r in both}
    comparison = Comparison(3, list(finals))
    _conclude(comparison, ranker, {r.name: r for r in both}, finals, None)
    assert "cheap" in comparison.tied and comparison.recommended == "leader"
    # without Pareto objectives the same tie recommends the cheaper config
    plain = Ranker({"perf_throughput": 1.0}, {})
    plain.rank(both)
    comparison = Comparison(3, list(finals))
    _conclude(comparison, plain, {r.name: r for r in both}, finals, None)
    assert comparison.recommended == "cheap"


def test_the_top_across_models_keeps_each_models_own_order():
    """A finalist that left its model's race may have the higher mean over its fewer rounds;
    across models it keeps its place in its model's ranking (behind the leader it lost to), and
    the models' lists merge by score."""
    from types import SimpleNamespace

    from analyzer.config.model_specs import ModelSpec
    from analyzer.results.outcome import ModelOutcome
    from analyzer.results.ranking import top_across_models

    ranker = Ranker({"perf_throughput": 1.0}, {})
    base = [1000.0, 1010.0, 990.0, 600.0, 610.0, 590.0, 600.0]
    leader, left = result("leader", 1, 16, [950.0]), result("left", 1, 8, [940.0])
    leader.final = summarize([point("leader", t) for t in base])
    left.final = summarize([point("left", t * 0.9) for t in base[:3]])
    left.final.left_race = True
    mark_ties({"leader": leader.final, "left": left.final}, "leader", ranker.score)
    other = [result("o1", 1, 8, [800.0]), result("o2", 1, 8, [600.0])]
    models = [ModelOutcome(ModelSpec("m"), ranker.rank([left, leader])),
              ModelOutcome(ModelSpec("n"), ranker.rank(other))]  # fmt: skip
    outcome = SimpleNamespace(models=models, config=SimpleNamespace(num_top_model_configs=3))
    assert [r.name for r in top_across_models(outcome)] == ["o1", "leader", "left"]  # type: ignore[arg-type]
