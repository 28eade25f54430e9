"""PNG charts from the benchmark JSON files.

- serving.png: TTFA p50 and audio s/s versus concurrency, one line per bench_serving file
  (e.g. the low-latency and high-throughput profiles); with `--group-by profile`, one line per
  deploy config, so single-concurrency files of one profile join into one line. `FILE:16,64`
  keeps only those levels of a file. Where several runs give one point, the line goes through
  the first given and a bar spans them all. A request variant other than pcm (a format, SSE,
  word timestamps: bench_serving's `--variants`) is a line of its own.
- continuity.png (`--continuity FILES`, the same file syntax): what listeners got against
  concurrency, one line per profile or file as above: the share of streams stalled (a player
  that started at the first byte fell more than the run's threshold behind), and goodput (audio
  s/s of the streams with TTFA within the budget and no stall) beside all audio s/s (dotted).
  Only levels measured since bench_serving reports them.
- step.png: Stage 0 step time (median) versus batch, one panel per context length, one line per
  graph path and step kind (decode solid; mixed = decodes + one prefill chunk, dotted), with the
  bandwidth floor dashed; `--step-gpu` adds the GPU-only time (dash-dot) where the file has it.

Usage: python benchmarks/plot.py --serving ll.json ht.json --step step.json --out-dir plots/
       python benchmarks/plot.py --group-by profile --serving fp_c1.json fp_c16.json ll.json:1,16 ...
       python benchmarks/plot.py --group-by profile --continuity sat_on.json ht_on.json --out-dir plots/
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display on the GPU machine or in CI
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import ScalarFormatter  # noqa: E402

_PATH_STYLE = {"eager": "tab:red", "mlp_graphs": "tab:blue", "full_graph": "tab:green", "piecewise": "tab:purple"}


def _load(path: str | Path, tool: str) -> dict:
    data = json.loads(Path(path).read_text())
    if data.get("tool") != tool:
        raise SystemExit(f"plot: {path} is not a {tool} result (tool={data.get('tool')!r})")
    return data


def _log2_concurrency_axis(ax, values: list[int]) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xticks(values)
    ax.set_xticklabels([str(v) for v in values])
    ax.set_xlabel("concurrency")
    ax.grid(True, which="both", alpha=0.3)


def _group_by(rows: list[dict], key: str) -> dict:
    """{row[key]: [rows with that value]}, in first-seen order."""
    groups: dict = defaultdict(list)
    for row in rows:
        groups[row[key]].append(row)
    return groups


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    # the format follows the suffix (the docs site draws .svg); no date in the file, so a redraw
    # of the same JSON writes the same bytes
    fig.savefig(path, dpi=120, metadata={"Date": None} if path.suffix == ".svg" else None)
    plt.close(fig)
    return path


def _serving_spec(arg: str) -> tuple[str, set[int] | None]:
    """'run.json' -> (path, None); 'run.json:16,64' -> (path, {16, 64}): only those levels."""
    path, sep, tail = arg.rpartition(":")
    if sep and tail and all(part.isdigit() for part in tail.split(",")):
        return path, {int(part) for part in tail.split(",")}
    return arg, None


def _profile(run: dict) -> str:
    """The deploy config a run served (a bundled name without its model prefix, or a YAML's stem)."""
    config = (run.get("settings") or {}).get("deploy_config") or run["label"]
    name = Path(config).stem if config.endswith((".yaml", ".yml")) else config
    return name.removeprefix("higgs_multimodal_qwen3_")


def _variant(level: dict) -> str:
    """A level's request variant (bench_serving's `variant`; its format in older files)."""
    return level.get("variant") or level.get("response_format") or "pcm"


def serving_series(specs: list[str], group_by: str = "file") -> list[tuple[str, dict[int, list[dict]]]]:
    """[(line label, {concurrency: [completed levels, in the order given]})]: one line per file
    (its label), or with group_by="profile" one line per deploy config, in first-seen order; a
    variant other than pcm is a line of its own ("label (mp3)")."""
    series: dict = {}
    for i, spec in enumerate(specs):
        path, keep = _serving_spec(spec)
        run = _load(path, "bench_serving")
        key = _profile(run) if group_by == "profile" else (i, run["label"])
        for lv in run["levels"]:
            if lv["completed"] and (keep is None or lv["concurrency"] in keep):
                series.setdefault((key, _variant(lv)), {}).setdefault(lv["concurrency"], []).append(lv)
    lines = []
    for (key, variant), points in series.items():
        label = key if isinstance(key, str) else key[1]
        lines.append((label if variant == "pcm" else f"{label} ({variant})", dict(sorted(points.items()))))
    return lines


def _plot_series(ax, points: dict[int, list[dict]], metric: str, label: str | None, scale: float = 1.0,
                 **style):
    c = list(points)
    y = [scale * points[x][0][metric] for x in c]  # the first run given for each point
    low = [yi - min(scale * lv[metric] for lv in points[x]) for x, yi in zip(c, y)]
    high = [max(scale * lv[metric] for lv in points[x]) - yi for x, yi in zip(c, y)]
    style = {"marker": "o", "capsize": 4, **style}
    return ax.errorbar(c, y, yerr=[low, high] if any(low) or any(high) else None, label=label, **style)


def plot_serving(files: list[str], out: Path, group_by: str = "file", file_name: str = "serving.png") -> Path:
    series = serving_series(files, group_by)
    runs = [_load(_serving_spec(f)[0], "bench_serving") for f in files]
    fig, (ax_ttfa, ax_tput) = plt.subplots(1, 2, figsize=(11, 4.2))
    all_c: set[int] = set()
    for label, points in series:
        all_c.update(points)
        _plot_series(ax_ttfa, points, "ttfa_ms_p50", label)
        _plot_series(ax_tput, points, "audio_s_per_s", label)
    for ax in (ax_ttfa, ax_tput):
        _log2_concurrency_axis(ax, sorted(all_c))
        ax.legend()
    if group_by == "profile":
        ax_ttfa.set_yscale("log")  # tens of ms at c = 1 beside seconds of queueing
    ax_ttfa.set_ylabel("TTFA p50 (ms)")
    ax_ttfa.set_title("Time to first audio")
    ax_tput.set_ylabel("audio seconds / wall second")
    ax_tput.set_title("Audio throughput")
    frames = {run["settings"]["frames"] for run in runs}
    fig.suptitle(f"higgs-serve streaming, {'/'.join(map(str, sorted(frames)))} frames per request")
    return _save(fig, out / file_name)


def plot_time_budget(path: str, out: Path, file_name: str = "time_budget.png") -> Path:
    """Issue 58's budget (benchmarks/step/time_budget.py's JSON): per level, the step timed at
    start-up and what the loop adds around it at load, beside the step a goal rate needs at that
    many rows and the weights' bandwidth floor; one panel a run."""
    runs = _load(path, "time_budget")["runs"]
    fig, axes = plt.subplots(1, len(runs), figsize=(5.5 * len(runs), 4), squeeze=False)
    for ax, run in zip(axes[0], runs):
        levels = run["levels"]
        names = [f"c={lv['concurrency']}\n{lv['rows_per_step']:.0f} rows" for lv in levels]
        timed = [lv["timed_step_ms"] for lv in levels]
        ax.bar(names, timed, label="timed step (device + launch)")
        ax.bar(names, [lv["loop_ms"] for lv in levels], bottom=timed, label="the loop around it at load")
        ax.plot(names, [lv["goal_step_ms"] for lv in levels], "k_", markersize=30,
                label=f"step {run['goal_audio_s_per_s']:.0f} audio s/s would need at these rows")
        ax.axhline(levels[0]["floor_ms"], color="grey", linestyle=":", label="weights read once (bandwidth floor)")
        ax.set_title(run["label"])
        ax.set_ylabel("ms per step")
        ax.legend(fontsize=7)
    fig.tight_layout()
    target = out / file_name
    fig.savefig(target, dpi=110)
    plt.close(fig)
    return target


def plot_continuity(files: list[str], out: Path, group_by: str = "file",
                    file_name: str = "continuity.png") -> Path:
    """Stalled share and goodput against concurrency, from the levels that report them."""
    series = [(label, {c: lvs for c, lvs in points.items() if lvs[0].get("goodput_audio_s_per_s") is not None})
              for label, points in serving_series(files, group_by)]
    series = [(label, points) for label, points in series if points]
    if not series:
        raise SystemExit("plot: no level of these files reports stalls and goodput (bench_serving since issue 53)")
    runs = [_load(_serving_spec(f)[0], "bench_serving") for f in files]
    fig, (ax_stall, ax_good) = plt.subplots(1, 2, figsize=(11, 4.2))
    all_c: set[int] = set()
    for label, points in series:
        all_c.update(points)
        _plot_series(ax_stall, points, "stalled_share", label, scale=100.0)
        line = _plot_series(ax_good, points, "goodput_audio_s_per_s", label)
        _plot_series(ax_good, points, "audio_s_per_s", None, color=line.lines[0].get_color(), linestyle=":",
                     alpha=0.5, marker="x")
    for ax in (ax_stall, ax_good):
        _log2_concurrency_axis(ax, sorted(all_c))
        ax.legend(fontsize=8)
    settings = [run["settings"] for run in runs if "stall_threshold_ms" in run["settings"]]
    threshold = "/".join(sorted({f"{s['stall_threshold_ms']:g}" for s in settings}))
    budget = "/".join(sorted({f"{s['ttfa_budget_ms']:g}" for s in settings}))
    ax_stall.set_ylabel(f"streams stalled > {threshold} ms (%)")
    ax_stall.set_ylim(bottom=0)
    ax_stall.set_title("Streams that ran dry")
    ax_good.set_ylabel("audio seconds / wall second")
    ax_good.set_ylim(bottom=0)
    ax_good.set_title(f"Goodput (TTFA <= {budget} ms, no stall); dotted: all audio")
    frames = {run["settings"]["frames"] for run in runs}
    fig.suptitle(f"higgs-serve streaming, {'/'.join(map(str, sorted(frames)))} frames per request: what listeners got")
    return _save(fig, out / file_name)


def plot_step(file: str, out: Path, paths: list[str] | None = None, kinds: list[str] | None = None,
              gpu: bool = False, file_name: str = "step.png") -> Path:
    """Step time against batch per (path, step kind, variant); `paths` / `kinds` keep only those;
    `gpu` adds each line's GPU-only time where the file has it."""
    data = _load(file, "bench_step")
    data["rows"] = [r for r in data["rows"] if (not paths or r["path"] in paths)
                    and (not kinds or r.get("step", "decode") in kinds)]
    for row in data["rows"]:
        # files before mixed steps: decode only; before --gemm / --pdl / --tapes: no such label
        row["line"] = (row["path"], row.get("step", "decode"), row.get("gemm"), row.get("pdl"), row.get("tapes"))
    by_context = _group_by(data["rows"], "context")  # {context: rows}
    contexts = sorted(by_context)
    fig, axes = plt.subplots(1, len(contexts), figsize=(max(6.4, 4.6 * len(contexts)), 4.2), squeeze=False)
    for ax, context in zip(axes[0], contexts):
        rows = by_context[context]
        for (path, kind, gemm, pdl, tapes), prow in _group_by(rows, "line").items():
            prow.sort(key=lambda r: r["batch"])
            variant = ", ".join(v for v in (gemm, pdl and f"PDL {pdl}", tapes and f"tapes {tapes}") if v)
            label = path + (f" ({variant})" if variant else "") + (", mixed" if kind == "mixed" else "")
            # the variant the change is measured against
            baseline = gemm == "cublas" or pdl == "off" or tapes == "off"
            ax.plot([r["batch"] for r in prow], [r["step_ms_median"] for r in prow],
                    marker="x" if baseline else "o", alpha=0.5 if baseline else 1.0,
                    color=_PATH_STYLE.get(path), linestyle=":" if kind == "mixed" else "-", label=label)
            gpu_rows = [r for r in prow if r.get("gpu_ms") is not None]
            if gpu and gpu_rows:
                ax.plot([r["batch"] for r in gpu_rows], [r["gpu_ms"] for r in gpu_rows], marker="s",
                        color=_PATH_STYLE.get(path), linestyle="-.", label=f"{label}, GPU only")
        floor = {r["batch"]: r["floor_ms"] for r in rows}
        batches = sorted(floor)
        ax.plot(batches, [floor[b] for b in batches], "k--", label="bandwidth floor")
        _log2_concurrency_axis(ax, batches)
        ax.set_xlabel("batch")
        ax.set_ylabel("step (ms, median)")
        ax.set_yscale("log")  # eager vs graph vs floor span more than 10x
        ax.yaxis.set_major_formatter(ScalarFormatter())  # 2, 3, 4 ms rather than 2x10^0
        ax.yaxis.set_minor_formatter(ScalarFormatter())
        ax.set_title(f"context {context}")
        ax.legend(fontsize=8)
    name = data["device"].get("cuda_name") or data["device"].get("torch_device")
    fig.suptitle(f"Stage 0 step, {name}, copy bandwidth {data['copy_bandwidth_gbps']:.0f} GB/s")
    return _save(fig, out / file_name)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--serving", nargs="*", default=[],
                   help="bench_serving JSON files (one line each), FILE:C,C for only those levels")
    p.add_argument("--continuity", nargs="*", default=[],
                   help="bench_serving JSON files for continuity.png (stalled share, goodput), FILE:C,C as --serving")
    p.add_argument("--group-by", choices=["file", "profile"], default="file",
                   help="one serving line per file, or per deploy config (profile)")
    p.add_argument("--step", default=None, help="a bench_step JSON file")
    p.add_argument("--step-paths", nargs="*", default=None, help="only these graph paths of --step")
    p.add_argument("--step-kinds", nargs="*", choices=["decode", "mixed"], default=None,
                   help="only these step kinds of --step")
    p.add_argument("--step-gpu", action="store_true", help="also draw the GPU-only step time")
    p.add_argument("--out-dir", default=".")
    args = p.parse_args(argv)
    if not args.serving and not args.step and not args.continuity:
        p.error("give --serving files, --continuity files and/or --step")
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if args.serving:
        print(f"wrote {plot_serving(args.serving, out, args.group_by)}")
    if args.continuity:
        print(f"wrote {plot_continuity(args.continuity, out, args.group_by)}")
    if args.step:
        print(f"wrote {plot_step(args.step, out, args.step_paths, args.step_kinds, args.step_gpu)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
