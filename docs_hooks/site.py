"""mkdocs hook for the documentation site (mkdocs.yml `hooks:`).

Three jobs, all at build time and offline, so nothing on the site can go stale by hand:
- copies `benchmarks/results/` (its README becomes a page, the JSON beside it static files) and
  `examples/` into the site, so the pages can link to the runs and the example configs;
- rewrites the pages' repository-relative links to those folders (`../benchmarks/results/X`,
  `../examples/X`: right when the page is read in the repository) to the site's copies, before
  mkdocs validates links, so a link to a file that does not exist still fails the strict build;
- draws the performance page's plots (`plots/*.svg`: serving, step, continuity) from the
  committed JSON with `benchmarks/plot.py`, the same code that draws the results README's PNGs.
"""

from __future__ import annotations

import importlib.util
import tempfile
from pathlib import Path

from mkdocs.structure.files import File, Files

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"

# repository folder -> where its copy lies in the site (and what the pages' links are rewritten to)
MIRRORED = {"benchmarks/results": "results", "examples": "examples"}

# The serving plot: the launch-tape sweep of issue 32, one file per profile, all from one GPU session
# (benchmarks/results/README.md, "Issue 32, second session"). The step plot: that session's step.
SERVING_SWEEP = ["serving_ht_tapes_poolfix_h200.json", "serving_ll_tapes_264330c_h200.json",
                 "serving_fp_264330c_h200.json"]
STEP_RUN = "step_tapes_264330c_h200.json"
# The continuity plot (stalled share and goodput against concurrency): issue 53's runs, one line each
# (benchmarks/results/README.md, "Issue 53").
CONTINUITY_RUNS = ["serving_overload_before_d6d6d7b_cpu.json", "serving_overload_no_deadlines_8e681b2_cpu.json",
                   "serving_overload_after_8e681b2_cpu.json"]
# Issue 59's admission: the policy on against off on one H100 (the last call, the default profile)
# and the H200's saturation config; issue 58's budget, read from those runs
ADMISSION_RUNS = ["admit_ht_on_80f52b0_h100.json", "admit_ht_off_80f52b0_h100.json",
                  "admit_sat_on_7106ad5_h200.json", "admit_sat_off_7106ad5_h200.json"]
TIME_BUDGET = "time_budget_h100.json"


def _plot_module():
    spec = importlib.util.spec_from_file_location("higgs_serve_bench_plot", REPO / "benchmarks" / "plot.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _draw_plots() -> dict[str, bytes]:
    """{site path: SVG bytes} for every plot the pages show."""
    import matplotlib

    plot = _plot_module()
    matplotlib.rcParams["svg.hashsalt"] = "higgs-serve-docs"  # stable element ids: same JSON, same bytes
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        serving = plot.plot_serving([str(RESULTS / f) for f in SERVING_SWEEP], out, group_by="profile",
                                    file_name="serving.svg")
        step = plot.plot_step(str(RESULTS / STEP_RUN), out, gpu=True, file_name="step.svg")
        continuity = plot.plot_continuity([str(RESULTS / f) for f in CONTINUITY_RUNS], out,
                                          file_name="continuity.svg")
        admission = plot.plot_continuity([str(RESULTS / f) for f in ADMISSION_RUNS], out,
                                         file_name="admission.svg")
        budget = plot.plot_time_budget(str(RESULTS / TIME_BUDGET), out, file_name="time_budget.svg")
        return {"plots/serving.svg": serving.read_bytes(), "plots/step.svg": step.read_bytes(),
                "plots/continuity.svg": continuity.read_bytes(), "plots/admission.svg": admission.read_bytes(),
                "plots/time_budget.svg": budget.read_bytes()}


def on_files(files: Files, config) -> Files:
    for folder, site_folder in MIRRORED.items():
        root = REPO / folder
        for path in sorted(p for p in root.rglob("*") if p.is_file()):
            src_uri = f"{site_folder}/{path.relative_to(root).as_posix()}"
            files.append(File.generated(config, src_uri, abs_src_path=str(path)))
    for src_uri, content in _draw_plots().items():
        files.append(File.generated(config, src_uri, content=content))
    return files


def on_page_markdown(markdown: str, page, config, files) -> str:
    for folder, site_folder in MIRRORED.items():
        markdown = markdown.replace(f"](../{folder}/", f"]({site_folder}/")
    return markdown
