// The playground page: its forms wired to the API (api.js) and the players. Each concept has its
// own module beside this one; this file only reads the controls and shows what comes back.
// `window.playground` exposes the players' real state (the browser tests read it).

import { ServerError, apiKey, call, setApiKey } from "./api.js";
import { probeWebCodecs } from "./codec_player.js";
import { LiveSession } from "./live.js";
import { PcmPlayer } from "./pcm_player.js";
import { DEFAULT_RATES_HZ, Utterance, playPath, playerRateHz } from "./speak.js";
import { WordHighlighter } from "./words.js";

const $ = (id) => document.getElementById(id);
const pcmPlayer = new PcmPlayer();
const words = new WordHighlighter($("words"));
let utterance = null; // the last Speak
let live = null; // the WebSocket session
let downloadUrl = null;

function describe(error) {
  if (!(error instanceof ServerError)) return error.message || String(error);
  const detail = [error.status ? `HTTP ${error.status}` : null, error.code, error.param && `param ${error.param}`];
  return `${error.message} (${detail.filter(Boolean).join(", ")})`;
}

function show(id, text) {
  $(id).textContent = text || "";
}

// ------------------------------------------------------------------------------ key and voices
async function loadVoices(selected) {
  try {
    const { data } = await (await call("/v1/audio/voices")).json();
    const select = $("voice");
    const keep = selected || select.value;
    select.replaceChildren(new Option("default", "default"),
      ...data.map((voice) => new Option(`${voice.name} (${voice.duration_s.toFixed(1)} s)`, voice.name)));
    select.value = data.some((voice) => voice.name === keep) ? keep : "default";
    show("server-status", `Connected: ${data.length} registered voice${data.length === 1 ? "" : "s"}.`);
  } catch (error) {
    const needsKey = error instanceof ServerError && error.status === 401;
    show("server-status", needsKey ? `This server needs an API key: ${error.message}` : describe(error));
    if (needsKey) $("api-key").focus();
  }
}

/** Whether the server wants a key: its public API description declares the bearer scheme when
 * it does (asked first, so a page opened without a key shows no refused request). */
async function needsKey() {
  try {
    const description = await (await fetch("/openapi.json")).json();
    return Boolean(description.components && description.components.securitySchemes
      && description.components.securitySchemes.HTTPBearer);
  } catch {
    return false; // no description (a proxy hides it): the voices' answer will tell
  }
}

/** Each format's option names the path it plays by in this browser. */
function labelFormats() {
  for (const option of $("format").options) {
    const path = playPath(option.value);
    option.textContent = `${option.value} (${path === "file" ? "as a file" : path})`;
  }
}

async function connect() {
  await probeWebCodecs(); // before Speak can be used: the click chooses a path at once
  labelFormats();
  if (!apiKey() && (await needsKey())) {
    show("server-status", "This server needs an API key: enter it above.");
    $("api-key").focus();
    return;
  }
  await loadVoices();
}

$("api-key").value = apiKey();
$("key-form").addEventListener("submit", (event) => {
  event.preventDefault();
  setApiKey($("api-key").value.trim());
  loadVoices();
});

// ------------------------------------------------------------------------------ Speak
/** A number control's value; undefined when empty (the server's default). */
function numberField(id, label) {
  const input = $(id);
  if (input.validity.badInput) throw new Error(`${label} is not a number`);
  return input.value.trim() === "" ? undefined : Number(input.value);
}

function sampling() {
  return {
    voice: $("voice").value, seed: numberField("seed", "Seed"),
    temperature: numberField("temperature", "Temperature"), top_p: numberField("top_p", "Top p"),
    top_k: numberField("top_k", "Top k"), max_new_tokens: numberField("max_new_tokens", "Max frames"),
  };
}

/** `fields()`, or null once the reason it cannot be read is shown in `errorId`. */
function readForm(fields, errorId) {
  try {
    return fields();
  } catch (error) {
    show(errorId, error.message);
    return null;
  }
}

function speechBody() {
  return {
    input: $("text").value, response_format: $("format").value, speed: numberField("speed", "Speed"),
    stream_format: "sse", word_timestamps: $("words-on").checked, ...sampling(),
  };
}

function setDownload(source) {
  const link = $("download");
  if (downloadUrl) URL.revokeObjectURL(downloadUrl);
  downloadUrl = null;
  const heard = source && source.chunks.length ? source.heard() : null;
  link.classList.toggle("disabled", !heard);
  link.setAttribute("aria-disabled", String(!heard));
  if (!heard) {
    link.removeAttribute("href");
    return;
  }
  downloadUrl = URL.createObjectURL(heard.blob);
  link.href = downloadUrl;
  link.download = heard.name;
}

function stopAll() {
  if (utterance) utterance.stop();
  if (live) live.close();
  pcmPlayer.stop();
}

$("speak-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  show("speak-error");
  const body = readForm(speechBody, "speak-error");
  if (!body) return;
  stopAll();
  // the AudioContext starts inside the click (browsers start audio from a user's gesture)
  const rateHz = playerRateHz(body.response_format);
  if (rateHz) pcmPlayer.open(rateHz);
  words.clear();
  setDownload(null);
  const current = new Utterance(body, { pcmPlayer, media: $("media"), words });
  utterance = current;
  try {
    await current.run();
  } catch (error) {
    if (error.name !== "AbortError") show("speak-error", describe(error));
  } finally {
    if (utterance === current) setDownload(current); // not one a later Speak replaced
  }
});

$("stop").addEventListener("click", stopAll);

// ------------------------------------------------------------------------------ the strip
const ms = (value) => (value === null ? "–" : `${Math.round(value)} ms`);

function refresh() {
  const state = utterance ? utterance.state() : null;
  if (utterance) words.show(utterance.positionS());
  const meter = live && !utterance ? live.meter : utterance && utterance.meter;
  if (!meter) return;
  show("strip-path", live && !utterance ? "WebSocket → Web Audio" : state.path);
  show("strip-ttfa", state ? ms(state.ttfaMs) : ms(live.firstAudioMs));
  show("strip-first-sound", state ? ms(state.firstSoundMs) : "–");
  show("strip-ahead", `${(state ? state.aheadS : pcmPlayer.aheadS()).toFixed(2)} s`);
  const streamed = !state || state.path !== "file";
  show("strip-gaps", streamed ? String(meter.gaps) : "–");
  show("strip-longest", streamed ? ms(1000 * meter.longestS) : "–");
  show("strip-behind", streamed ? ms(1000 * meter.behindS) : "–");
}

setInterval(refresh, 50);

// ------------------------------------------------------------------------------ live text (WebSocket)
const liveView = {
  onSentence(event) {
    for (const item of $("live-sentences").querySelectorAll("li.now")) item.classList.remove("now");
    const item = document.createElement("li");
    item.textContent = event.sentence_text;
    item.className = "now";
    $("live-sentences").append(item);
  },
  onSpoken() {},
  onDone() {},
  onError(error) {
    show("live-error", describe(error));
  },
  onClosed() {
    $("live-text").disabled = true;
    $("live-done").disabled = true;
  },
};

$("live-start").addEventListener("click", async () => {
  show("live-error");
  const config = readForm(sampling, "live-error");
  if (!config) return;
  stopAll();
  utterance = null;
  pcmPlayer.open(DEFAULT_RATES_HZ.pcm);
  live = new LiveSession(config, pcmPlayer, liveView);
  $("live-sentences").replaceChildren();
  try {
    await live.open();
  } catch (error) {
    show("live-error", describe(error));
    return;
  }
  $("live-text").value = "";
  $("live-text").disabled = false;
  $("live-done").disabled = false;
  $("live-text").focus();
});

$("live-text").addEventListener("input", () => {
  const text = $("live-text").value;
  const kept = live.typed(text);
  if (kept !== text) {
    $("live-text").value = kept;
    show("live-error", "Text already sent cannot change: type at the end.");
  }
});

$("live-done").addEventListener("click", () => live.finish());

// ------------------------------------------------------------------------------ clone, detect
$("clone-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  show("clone-error");
  show("clone-status");
  const form = new FormData();
  form.append("name", $("clone-name").value.trim());
  form.append("audio_sample", $("clone-clip").files[0]);
  if ($("clone-text").value.trim()) form.append("ref_text", $("clone-text").value.trim());
  try {
    const voice = await (await call("/v1/audio/voices", { method: "POST", form })).json();
    await loadVoices(voice.name);
    show("clone-status", `Registered “${voice.name}” (${voice.duration_s.toFixed(1)} s): selected for Speak.`);
  } catch (error) {
    show("clone-error", describe(error));
  }
});

$("detect-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  show("detect-error");
  show("detect-result");
  const form = new FormData();
  form.append("file", $("detect-file").files[0]);
  try {
    const found = await (await call("/v1/audio/watermark/detect", { method: "POST", form })).json();
    const result = $("detect-result");
    result.dataset.verdict = found.verdict;
    result.dataset.score = String(found.score);
    result.textContent = `Verdict: ${found.verdict.replace("_", " ")} (score ${found.score.toFixed(4)})`;
  } catch (error) {
    show("detect-error", describe(error));
  }
});

window.playground = {
  speakState: () => (utterance ? utterance.state() : null),
  liveState: () => (live ? live.state() : null),
};

connect();
