"""Reports a person reads: rendered from a real profile run, checked in a real browser."""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
import sys

import pytest
from test_profile import EXAMPLES, FAST, profile, results

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One real profile of add_sub; its repository is a copy the tests may delete."""
    root = tmp_path_factory.mktemp("report")
    repo = root / "repo"
    shutil.copytree(EXAMPLES / "add_sub", repo / "add_sub")
    done = profile(
        root, "--model-repository", str(repo), "--profile-models", "add_sub",
        "--output-model-repository-path", "OUT", "--export-path", "EXP", "-c", "1,2",
        "--run-config-search-max-instance-count", "1", "--run-config-search-max-model-batch-size",
        "2", "--latency-budget", "50", "--client-protocol", "http", *FAST,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return root


def default_name(model: dict) -> str:
    return next(c["name"] for c in model["configs"] if c["is_default"])


def test_summary_names_the_recommendation_and_lists_every_config(run):
    document = results(run / "EXP")
    model = document["models"][0]
    measured = [c for c in model["configs"] if c["measurements"]]
    winner = min(measured, key=lambda c: c["rank"])
    page = (run / "EXP" / "reports" / "summaries" / "add_sub" / "result_summary.html").read_text()
    recommendation = re.search(r'id="recommendation">(.*?)</p>', page, re.S).group(1)
    assert f"Use {winner['name']} (" in recommendation
    assert "the default config" in recommendation and "within the 50 ms budget" in recommendation
    table = re.search(r'<table id="ranking">(.*?)</table>', page, re.S).group(1)
    body = table.split("<tbody>")[1]
    assert body.count("<tr") == len(measured)
    for config in measured:
        assert config["name"] in body
    pattern = r'<img class="plot" alt="([^"]+)" src="data:image/png;base64,([^"]+)"'
    images = re.findall(pattern, page)
    comparison = model["final_comparison"]  # the side-by-side rounds: intervals and ties
    assert comparison["rounds"] == 2 and default_name(model) in comparison["finalists"]
    by_name = {c["name"]: c for c in model["configs"]}
    for name in comparison["finalists"]:
        final = by_name[name]["final_comparison"]
        assert final["rounds"] == 2 and len(final["measurements"]) == 2
        for tag in ("perf_throughput", "perf_latency_p99"):
            interval = final[tag]
            assert interval["low"] <= interval["estimate"] <= interval["high"]
        assert final["tied_with_leader"] == (name in comparison["tied"])
        # the number the ranking shows is the rounds' mean, not the search's point
        assert by_name[name]["best"]["metrics"]["perf_throughput"] == pytest.approx(
            final["perf_throughput"]["estimate"])
    assert comparison["recommended"] == winner["name"]
    assert comparison["recommended"] in comparison["tied"] + [comparison["leader"]]
    assert comparison["leader"] in comparison["tied"]
    ratio = comparison["throughput_vs_default"]  # none when the default is recommended
    assert (ratio is None) == (comparison["recommended"] == default_name(model))
    if ratio is not None:
        assert ratio["low"] <= ratio["estimate"] <= ratio["high"]
    assert "configs were measured again side by side" in html.unescape(page)
    assert [alt for alt, _ in images] == [
        "throughput vs p99 latency per config, Pareto front marked",
        "final comparison: throughput and p99 with 95% intervals",
        "throughput vs load for the winner and the default",
    ]  # no GPU here: no GPU-memory plot
    for config in measured:  # every point carries its error bar: a 95% CI half-width in %
        for m in config["measurements"]:
            assert 0 < m["metrics"]["perf_throughput_ci_pct"] < 1000
    if document["cpu_placement"]["worker_cpus"] != "all":
        assert "CPU placement" in page and document["cpu_placement"]["how"] in html.unescape(page)
    assert all(len(data) > 1000 for _, data in images)
    assert "http://" not in page and "https://" not in page  # self-contained
    for name in model["top"]:
        detailed = run / "EXP" / "reports" / "detailed" / name / "detailed_report.html"
        text = detailed.read_text()
        assert "config.pbtxt" in text and text.count('<img class="plot"') == 2
        assert f'name: "{name}"' in html.unescape(text)


_PROBE = """<script>
window.__failed = [];
window.addEventListener("error", function (e) {
  if (e.target && e.target !== window) { window.__failed.push(e.target.src || "resource"); }
}, true);
window.addEventListener("load", function () {
  var imgs = Array.prototype.map.call(document.images, function (i) {
    var box = i.getBoundingClientRect();
    return {complete: i.complete, w: i.naturalWidth, h: i.naturalHeight, shown: box.width};
  });
  var out = document.createElement("pre");
  out.id = "__probe";
  out.textContent = JSON.stringify({imgs: imgs, failed: window.__failed,
    resources: performance.getEntriesByType("resource").map(function (r) { return r.name; })});
  document.body.appendChild(out);
});
</script>"""


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (make venv "
                    "installs it as root)")  # fmt: skip
def test_summary_renders_in_headless_chromium(run):
    summary = run / "EXP" / "reports" / "summaries" / "add_sub" / "result_summary.html"
    probe = summary.with_name("probe.html")
    probe.write_text(summary.read_text().replace("<head>", "<head>" + _PROBE, 1))
    flags = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
             "--virtual-time-budget=10000"]  # fmt: skip
    dom = subprocess.run([*flags, "--dump-dom", probe.as_uri()], capture_output=True, text=True,
                         timeout=120)  # fmt: skip
    probe.unlink()
    found = re.search(r'<pre id="__probe">(.*?)</pre>', dom.stdout, re.S)
    assert found, dom.stderr[-2000:]
    state = json.loads(html.unescape(found.group(1)))
    assert len(state["imgs"]) == 3  # with the final comparison's
    for image in state["imgs"]:
        assert image["complete"] and image["w"] > 0 and image["h"] > 0 and image["shown"] > 0
    assert state["failed"] == []
    assert all(name.startswith("data:") for name in state["resources"])
    shot = run / "EXP" / "reports" / "summary_screenshot.png"
    subprocess.run([*flags, "--window-size=1280,2400", f"--screenshot={shot}", summary.as_uri()],
                   capture_output=True, timeout=120, check=True)  # fmt: skip
    assert shot.stat().st_size > 10_000


def test_report_rebuilds_identical_pages_without_the_repository(run, tmp_path):
    copy = tmp_path / "EXP"
    shutil.copytree(run / "EXP", copy)
    original = {p.relative_to(copy): p.read_bytes() for p in copy.rglob("*.html")}
    assert original
    shutil.rmtree(copy / "reports")
    moved = run / "repo-gone"
    (run / "repo").rename(moved)  # no model repository anywhere it was
    try:
        done = subprocess.run([sys.executable, "-m", "analyzer", "report", "--export-path",
                               str(copy)], capture_output=True, text=True, timeout=300)  # fmt: skip
    finally:
        moved.rename(run / "repo")
    assert done.returncode == 0, done.stderr
    rebuilt = {p.relative_to(copy): p.read_bytes() for p in copy.rglob("*.html")}
    assert rebuilt == original


def test_report_without_results_is_one_clear_error(tmp_path):
    done = subprocess.run([sys.executable, "-m", "analyzer", "report", "-e", str(tmp_path)],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 2
    assert "no profile results at" in done.stderr


def test_pdf_summary(run, tmp_path):
    copy = tmp_path / "EXP"
    shutil.copytree(run / "EXP", copy)
    done = subprocess.run([sys.executable, "-m", "analyzer", "report", "-e", str(copy),
                           "--report-format", "pdf"], capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    pdf = copy / "reports" / "summaries" / "add_sub" / "result_summary.pdf"
    assert pdf.read_bytes().startswith(b"%PDF") and pdf.stat().st_size > 20_000
    name = default_name(results(copy)["models"][0])
    pdf = copy / "reports" / "detailed" / name / "detailed_report.pdf"  # MA's name for it
    assert pdf.read_bytes().startswith(b"%PDF")


def test_report_model_configs_writes_the_named_configs_detailed_reports(run, tmp_path):
    """MA's `report -n`: the detailed report of each config named, and nothing else; MA's
    other report keys from a YAML file, those without an effect here noted; a name the run
    never measured is one clear error."""
    copy = tmp_path / "EXP"
    shutil.copytree(run / "EXP", copy)
    shutil.rmtree(copy / "reports")
    name = default_name(results(copy)["models"][0])
    done = subprocess.run([sys.executable, "-m", "analyzer", "report", "-e", str(copy),
                           "--report-model-configs", name], capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    detailed = sorted(p.parent.name for p in (copy / "reports").rglob("detailed_report.html"))
    assert detailed == [name]
    config = tmp_path / "report.yaml"
    config.write_text(f"export_path: {copy}\nreport_model_configs:\n  {name}:\n    plots: {{}}\n"
                      "output_formats: [html]\ncheckpoint_directory: /nowhere\n")
    done = subprocess.run([sys.executable, "-m", "analyzer", "report", "-f", str(config)],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "'checkpoint_directory' is accepted and changes nothing here" in done.stdout
    done = subprocess.run([sys.executable, "-m", "analyzer", "report", "-e", str(copy), "-n",
                           "add_sub_config_99"],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 2
    assert "report_model_configs names 'add_sub_config_99', which is no measured config" in (
        done.stderr)
    config.write_text(f"export_path: {copy}\noutput_formats: [html]\nexport_path: {copy}\n")
    done = subprocess.run([sys.executable, "-m", "analyzer", "report", "-f", str(config)],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 2
    assert "is not valid YAML at line 3: key 'export_path' is given twice (first at line 1)" in (
        done.stderr)


def test_offline_mode_adds_throughput_by_client_batch_size(run, tmp_path):
    """MA's global `-m offline`: the summary also plots throughput by client batch size; the
    default (online) does not; a mode MA does not know is one clear error."""
    copy = tmp_path / "EXP"
    shutil.copytree(run / "EXP", copy)
    page = copy / "reports" / "summaries" / "add_sub" / "result_summary.html"
    assert 'alt="throughput vs client batch size' not in page.read_text()
    done = subprocess.run([sys.executable, "-m", "analyzer", "-m", "offline", "report", "-e",
                           str(copy)], capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert 'alt="throughput vs client batch size' in page.read_text()
    done = subprocess.run([sys.executable, "-m", "analyzer", "-m", "batchy", "report", "-e",
                           str(copy)], capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 2 and "-m/--mode is 'batchy'" in done.stderr


def png_names(folder) -> list[str]:
    assert all(p.read_bytes().startswith(b"\x89PNG") for p in folder.glob("*.png"))
    return sorted(p.stem for p in folder.glob("*.png"))


def test_plots_folder_as_model_analyzer_lays_it_out(run):
    """MA's `plots/`: the summary's preset per model (no GPU sampled here, so RAM vs p99 takes
    the GPU memory plot's place) and, for each config given a detailed report, its latency
    breakdown and the report preset's plots without the GPU ones."""
    document = results(run / "EXP")
    model = document["models"][0]
    plots = run / "EXP" / "plots"
    assert png_names(plots / "simple" / "add_sub") == ["cpu_mem_v_latency", "throughput_v_latency"]
    detailed = sorted({*model["top"], default_name(model)})
    assert sorted(p.name for p in (plots / "detailed").iterdir()) == detailed
    for name in detailed:
        assert png_names(plots / "detailed" / name) == ["latency_breakdown"]
        assert png_names(plots / "simple" / name) == ["cpu_mem_v_latency"]


def test_report_plots_key_draws_the_plots_named(run, tmp_path):
    """MA's report key `plots` (every detailed report's) and a config's own `plots` under
    `report_model_configs`, which replaces it for that config; a plot whose axis is no metric
    is one clear error that names it, before anything is written."""
    copy = tmp_path / "EXP"
    shutil.copytree(run / "EXP", copy)
    shutil.rmtree(copy / "plots")
    model = results(copy)["models"][0]
    default = default_name(model)
    winner = min((c for c in model["configs"] if c["measurements"] and not c["is_default"]),
                 key=lambda c: c["rank"])["name"]
    config = tmp_path / "report.yaml"
    config.write_text(
        f"export_path: {copy}\n"
        "plots:\n"
        "  p50_v_load:\n"
        "    {title: p50 vs concurrency, x_axis: concurrency_range, y_axis: perf_latency_p50}\n"
        "report_model_configs:\n"
        f"  - {default}\n"
        f"  - {winner}:\n"
        "      plots:\n"
        "        tput:\n"
        "          {title: T, x_axis: perf_latency_p99, y_axis: perf_throughput, monotonic: true}\n"
    )  # fmt: skip
    done = subprocess.run([sys.executable, "-m", "analyzer", "report", "-f", str(config)],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert png_names(copy / "plots" / "simple" / default) == ["p50_v_load"]
    assert png_names(copy / "plots" / "simple" / winner) == ["tput"]
    assert png_names(copy / "plots" / "detailed" / winner) == ["latency_breakdown"]
    shutil.rmtree(copy / "plots")
    config.write_text(f"export_path: {copy}\nplots:\n  bad:\n"
                      "    {title: B, x_axis: perf_latency_p99, y_axis: perf_thruput}\n")
    done = subprocess.run([sys.executable, "-m", "analyzer", "report", "-f", str(config)],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 2
    assert f"{config}: plot 'bad' y_axis 'perf_thruput' is not a metric or load key" in (
        done.stderr)
    assert not (copy / "plots").exists()
