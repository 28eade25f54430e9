"""PNG charts from the benchmark JSON files.

- serving.png: TTFA p50 and audio s/s versus concurrency, one line per bench_serving file
  (e.g. the low-latency and high-throughput profiles).
- step.png: Stage 0 step time (median) versus batch, one panel per context length, one line per
  graph path and step kind (decode solid; mixed = decodes + one prefill chunk, dotted), with the
  bandwidth floor dashed.

Usage: python benchmarks/plot.py --serving ll.json ht.json --step step.json --out-dir plots/
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
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_serving(files: list[str], out: Path) -> Path:
    runs = [_load(f, "bench_serving") for f in files]
    fig, (ax_ttfa, ax_tput) = plt.subplots(1, 2, figsize=(11, 4.2))
    all_c: set[int] = set()
    for run in runs:
        levels = [lv for lv in run["levels"] if lv["completed"]]
        c = [lv["concurrency"] for lv in levels]
        all_c.update(c)
        ax_ttfa.plot(c, [lv["ttfa_ms_p50"] for lv in levels], marker="o", label=run["label"])
        ax_tput.plot(c, [lv["audio_s_per_s"] for lv in levels], marker="o", label=run["label"])
    for ax in (ax_ttfa, ax_tput):
        _log2_concurrency_axis(ax, sorted(all_c))
        ax.legend()
    ax_ttfa.set_ylabel("TTFA p50 (ms)")
    ax_ttfa.set_title("Time to first audio")
    ax_tput.set_ylabel("audio seconds / wall second")
    ax_tput.set_title("Audio throughput")
    frames = {run["settings"]["frames"] for run in runs}
    fig.suptitle(f"higgs-serve streaming, {'/'.join(map(str, sorted(frames)))} frames per request")
    return _save(fig, out / "serving.png")


def plot_step(file: str, out: Path, paths: list[str] | None = None, kinds: list[str] | None = None) -> Path:
    """Step time against batch per (path, step kind, variant); `paths` / `kinds` keep only those."""
    data = _load(file, "bench_step")
    data["rows"] = [r for r in data["rows"] if (not paths or r["path"] in paths)
                    and (not kinds or r.get("step", "decode") in kinds)]
    for row in data["rows"]:
        # files before mixed steps: decode only; before --gemm / --pdl: no such label
        row["line"] = (row["path"], row.get("step", "decode"), row.get("gemm"), row.get("pdl"))
    by_context = _group_by(data["rows"], "context")  # {context: rows}
    contexts = sorted(by_context)
    fig, axes = plt.subplots(1, len(contexts), figsize=(4.6 * len(contexts), 4.2), squeeze=False)
    for ax, context in zip(axes[0], contexts):
        rows = by_context[context]
        for (path, kind, gemm, pdl), prow in _group_by(rows, "line").items():
            prow.sort(key=lambda r: r["batch"])
            variant = ", ".join(v for v in (gemm, pdl and f"PDL {pdl}") if v)
            label = path + (f" ({variant})" if variant else "") + (", mixed" if kind == "mixed" else "")
            baseline = gemm == "cublas" or pdl == "off"  # the variant the change is measured against
            ax.plot([r["batch"] for r in prow], [r["step_ms_median"] for r in prow],
                    marker="x" if baseline else "o", alpha=0.5 if baseline else 1.0,
                    color=_PATH_STYLE.get(path), linestyle=":" if kind == "mixed" else "-", label=label)
        floor = {r["batch"]: r["floor_ms"] for r in rows}
        batches = sorted(floor)
        ax.plot(batches, [floor[b] for b in batches], "k--", label="bandwidth floor")
        _log2_concurrency_axis(ax, batches)
        ax.set_xlabel("batch")
        ax.set_ylabel("step (ms, median)")
        ax.set_yscale("log")  # eager vs graph vs floor span more than 10x
        ax.set_title(f"context {context}")
        ax.legend(fontsize=8)
    name = data["device"].get("cuda_name") or data["device"].get("torch_device")
    fig.suptitle(f"Stage 0 step, {name}, copy bandwidth {data['copy_bandwidth_gbps']:.0f} GB/s")
    return _save(fig, out / "step.png")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--serving", nargs="*", default=[], help="bench_serving JSON files (one line each)")
    p.add_argument("--step", default=None, help="a bench_step JSON file")
    p.add_argument("--step-paths", nargs="*", default=None, help="only these graph paths of --step")
    p.add_argument("--step-kinds", nargs="*", choices=["decode", "mixed"], default=None,
                   help="only these step kinds of --step")
    p.add_argument("--out-dir", default=".")
    args = p.parse_args(argv)
    if not args.serving and not args.step:
        p.error("give --serving files and/or --step")
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if args.serving:
        print(f"wrote {plot_serving(args.serving, out)}")
    if args.step:
        print(f"wrote {plot_step(args.step, out, args.step_paths, args.step_kinds)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
