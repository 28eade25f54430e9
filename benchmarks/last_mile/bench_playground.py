"""The playground in a real browser (issue 60): how soon each format sounds on the page, and the
screenshot of the page the docs show (docs/getting-started.md#the-playground).

One real server (`higgs-serve serve`, a subprocess; on CPU with a tiny random checkpoint the
script writes, unless --model names one) and Debian's Chromium, headless, driven by Playwright
(`sudo apt-get install -y chromium`; the `test` extras install Playwright). The page's own numbers
are read back (window.playground.speakState()): per format, the time to first audio (request
sent to the first audio bytes on the page) and the first sound (the scheduled start in Web Audio
of the first sample of speech: pcm's first buffer; mp3's and opus's first decoded buffer, the
codec's lead-in dropped, through WebCodecs), and the page's share, first sound less TTFA (for mp3
it includes the wait for the server's third chunk, which holds its first speech). After one
untimed round, --runs rounds of pcm, mp3 and opus one after the other; medians, and each
compressed format's first sound over the pcm TTFA (issue 60 asks for at most 1.5).
--without-webcodecs takes the page's AudioDecoder away before it loads: mp3 and opus then play
through Media Source (first sound: the element's `playing`), the path of browsers without it.

  python benchmarks/last_mile/bench_playground.py --runs 9 --out benchmarks/results/playground_ttfa_cpu.json
  python benchmarks/last_mile/bench_playground.py --runs 0 --screenshot docs/images/playground.png
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common, the groups
from common import now_iso, provenance, write_json  # noqa: E402
from serving.server_process import free_port, stop_server, wait_ready  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
FORMATS = ("pcm", "mp3", "opus")
SCREENSHOT_TEXT = ("Hello from higgs-serve. Every word lights up as it is spoken, and the strip "
                   "below counts the gaps a listener would hear.")


def start(args: argparse.Namespace, work: Path) -> tuple[subprocess.Popen, str]:
    model = args.model
    if model is None:
        model = str(work / "tiny-model")
        subprocess.run([sys.executable, "-m", "higgs_serve.cli", "make-tiny-model", model], check=True,
                       capture_output=True)
    port = free_port()
    log = work / "server.log"
    command = [sys.executable, "-m", "higgs_serve.cli", "--log-level", "WARNING", "serve", model,
               "--host", "127.0.0.1", "--port", str(port), "--device", args.device,
               "--voices-dir", str(work / "voices"),
               "--stage-overrides", f'{{"0": {{"default_sampling_params": {{"max_tokens": {args.frames}}}}}}}']
    with log.open("w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    wait_ready(process, url, 300, log)
    return process, url


def spoken(page, response_format: str, words: bool) -> dict:
    page.select_option("#format", response_format)
    page.set_checked("#words-on", words)
    page.click("#speak")
    page.wait_for_function("() => { const s = window.playground.speakState();"
                           " return Boolean(s && ((s.done && s.firstSoundMs !== null) || s.error)); }",
                           timeout=60_000)
    state = page.evaluate("window.playground.speakState()")
    if state["error"]:
        raise SystemExit(f"bench_playground: {response_format}: {state['error']}")
    return state


def measure(page, runs: int) -> dict:
    states: dict[str, list[dict]] = {f: [] for f in FORMATS}
    for round_ in range(runs + 1):  # round 0 is untimed: caches, the encoder process's first stream
        for response_format in FORMATS:
            state = spoken(page, response_format, words=False)
            if round_:
                states[response_format].append(state)
    formats = {f: {"ttfa_ms": [round(s["ttfaMs"], 1) for s in runs_],
                   "first_sound_ms": [round(s["firstSoundMs"], 1) for s in runs_],
                   "ttfa_ms_p50": statistics.median(s["ttfaMs"] for s in runs_),
                   "first_sound_ms_p50": statistics.median(s["firstSoundMs"] for s in runs_),
                   "first_sound_after_ttfa_ms_p50": statistics.median(s["firstSoundMs"] - s["ttfaMs"] for s in runs_),
                   "path": runs_[0]["path"]}
               for f, runs_ in states.items()}
    pcm_ttfa = formats["pcm"]["ttfa_ms_p50"]
    ratios = {f: formats[f]["first_sound_ms_p50"] / pcm_ttfa for f in ("mp3", "opus")}
    return {"formats": formats, "first_sound_over_pcm_ttfa": ratios}


def screenshot(page, path: Path) -> None:
    page.fill("#text", SCREENSHOT_TEXT)
    page.fill("#seed", "7")
    page.select_option("#format", "pcm")
    page.set_checked("#words-on", True)
    page.click("#speak")
    page.wait_for_function("() => document.querySelectorAll('#words span.spoken').length >= 4", timeout=60_000)
    path.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(path), full_page=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="a checkpoint (default: a tiny random one, written here)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--frames", type=int, default=75, help="each request's frame cap (25 a second)")
    parser.add_argument("--runs", type=int, default=5, help="timed rounds of every format (0: none)")
    parser.add_argument("--out", default=None, help="write the measurements here (JSON)")
    parser.add_argument("--screenshot", default=None, help="save the page, mid-Speak, as this PNG")
    parser.add_argument("--without-webcodecs", action="store_true",
                        help="take AudioDecoder away: mp3 and opus through Media Source")
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    if not os.access(CHROMIUM, os.X_OK):
        raise SystemExit(f"bench_playground: no Chromium at {CHROMIUM}: sudo apt-get install -y chromium")
    started_at = now_iso()
    load_before = os.getloadavg()  # the machine may be shared: its load beside the numbers
    with tempfile.TemporaryDirectory(prefix="bench_playground_") as tmp:
        process, url = start(args, Path(tmp))
        try:
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path=CHROMIUM,
                                                     args=["--autoplay-policy=no-user-gesture-required"])
                chromium_version = browser.version
                page = browser.new_page(viewport={"width": 1100, "height": 900})
                if args.without_webcodecs:
                    page.add_init_script("delete window.AudioDecoder;")
                page.goto(url + "/")
                page.wait_for_function("() => document.getElementById('server-status').textContent.startsWith('Connected')")
                result = measure(page, args.runs) if args.runs else None
                if args.screenshot:
                    screenshot(page, Path(args.screenshot))
                browser.close()
        finally:
            stop_server(process)
    if result is not None:
        print(f"medians of {args.runs}: " + ", ".join(
            f"{f} ({v['path']}) TTFA {v['ttfa_ms_p50']:.1f} ms, first sound {v['first_sound_ms_p50']:.1f} ms"
            for f, v in result["formats"].items()))
        print("first sound / pcm TTFA: " + ", ".join(f"{f} {r:.2f}" for f, r in result["first_sound_over_pcm_ttfa"].items()))
    if args.out and result is not None:
        write_json(args.out, {**provenance("bench_playground", started_at),
                              "config": {"model": args.model or "tiny (random)", "device": args.device,
                                         "frames": args.frames, "runs": args.runs,
                                         "without_webcodecs": args.without_webcodecs,
                                         "chromium": CHROMIUM, "chromium_version": chromium_version,
                                         "load_average_1_5_15_min": {"before": load_before, "after": os.getloadavg()}},
                              **result})


if __name__ == "__main__":
    main()
