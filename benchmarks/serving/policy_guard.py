"""The deadline policy against itself off, on one machine at the same loads (issue 59's guard):
two bench_serving JSON files of the same config, the policy on (as shipped) and off, level by
level. A level passes when the policy's goodput is at least

- 0.97 x the raw audio s/s of the policy off, where the policy off keeps its streams whole
  (at most 0.5 % stalled, first audio within the budget for 99 % of them): nothing to protect,
  so nothing may be lost;
- 0.95 x the best goodput the policy off reaches at any level, where it does not (overload:
  the policy refuses what it cannot start in time and must keep the rest whole);

and the streams the policy admitted are at most 0.5 % stalled. Every refusal must carry
Retry-After. The table and the verdicts go to stdout (and --out as JSON); the exit status is 1
when a level fails: a default that serves less than the engine can fails the run.

Usage: python benchmarks/serving/policy_guard.py --on ON.json --off OFF.json [--out guard.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

KEEPS_UP_STALLED = 0.005
RAW_SHARE = 0.97
OVERLOAD_SHARE = 0.95


def _levels(path: str) -> dict[tuple[str, int], dict]:
    data = json.loads(Path(path).read_text())
    return {(level.get("variant", "pcm"), level["concurrency"]): level for level in data["levels"]}


def _keeps_up(level: dict, budget_ms: float) -> bool:
    ttfa_p99 = level.get("ttfa_ms_p99") or 0.0
    return (level.get("stalled_share") or 0.0) <= KEEPS_UP_STALLED and ttfa_p99 <= budget_ms


def judge(on_path: str, off_path: str, budget_ms: float = 1000.0) -> list[dict]:
    on, off = _levels(on_path), _levels(off_path)
    best_off = max((lv.get("goodput_audio_s_per_s") or 0.0 for lv in off.values()), default=0.0)
    rows = []
    for key in sorted(on.keys() & off.keys(), key=lambda k: (k[0], k[1])):
        a, b = on[key], off[key]
        good = a.get("goodput_audio_s_per_s") or 0.0
        if _keeps_up(b, budget_ms):
            rule, base, share = "raw off", b.get("audio_s_per_s") or 0.0, RAW_SHARE
        else:
            rule, base, share = "best goodput off", best_off, OVERLOAD_SHARE
        floor = share * base
        refusals = a.get("refusals") or 0
        problems = []
        if good < floor:
            problems.append(f"goodput {good:.1f} < {floor:.1f} ({rule})")
        if (a.get("stalled_share") or 0.0) > KEEPS_UP_STALLED:
            problems.append(f"{100 * a['stalled_share']:.2f} % of admitted streams stalled")
        if refusals and (a.get("refusals_with_retry_after") or 0) < refusals:
            problems.append("a refusal without Retry-After")
        rows.append({
            "variant": key[0], "concurrency": key[1],
            "on_goodput": good, "on_audio_s_per_s": a.get("audio_s_per_s"), "on_stalled_share": a.get("stalled_share"),
            "on_refused": a.get("refused_requests"), "on_ttfa_ms_p50": a.get("ttfa_ms_p50"),
            "on_admitted_ttfa_ms_p99": a.get("ttfa_admitted_try_ms_p99"),
            "off_audio_s_per_s": b.get("audio_s_per_s"), "off_goodput": b.get("goodput_audio_s_per_s"),
            "off_stalled_share": b.get("stalled_share"), "off_ttfa_ms_p50": b.get("ttfa_ms_p50"),
            "rule": rule, "floor": floor, "ratio": good / base if base else None,
            "passed": not problems, "problems": problems,
        })
    return rows


def _fmt(value, pattern: str = "{:.1f}") -> str:
    return "-" if value is None else pattern.format(value)


def table(rows: list[dict]) -> str:
    lines = ["| c | on: goodput, raw, stalled, refused, TTFA p50 | off: raw, goodput, stalled, TTFA p50 | rule | verdict |",
             "|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['concurrency']} | {_fmt(r['on_goodput'])}, {_fmt(r['on_audio_s_per_s'])}, "
            f"{_fmt(100 * (r['on_stalled_share'] or 0), '{:.2f}')} %, {r['on_refused'] or 0}, {_fmt(r['on_ttfa_ms_p50'])} ms | "
            f"{_fmt(r['off_audio_s_per_s'])}, {_fmt(r['off_goodput'])}, {_fmt(100 * (r['off_stalled_share'] or 0), '{:.2f}')} %, "
            f"{_fmt(r['off_ttfa_ms_p50'])} ms | {r['rule']} (ratio {_fmt(r['ratio'], '{:.3f}')}) | "
            f"{'pass' if r['passed'] else 'FAIL: ' + '; '.join(r['problems'])} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--on", required=True, help="bench_serving JSON, the policy on")
    p.add_argument("--off", required=True, help="bench_serving JSON, the policy off, same config and machine")
    p.add_argument("--ttfa-budget-ms", type=float, default=1000.0)
    p.add_argument("--out", default=None, help="write the verdicts here as JSON")
    args = p.parse_args(argv)
    rows = judge(args.on, args.off, args.ttfa_budget_ms)
    print(table(rows))
    if args.out:
        Path(args.out).write_text(json.dumps({"on": args.on, "off": args.off, "levels": rows}, indent=1))
    return 0 if rows and all(r["passed"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
