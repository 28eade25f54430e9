// One Speak: POST /v1/audio/speech as SSE (the audio, word timestamps and a mid-stream error
// arrive as events), each piece of audio handed to its player the moment it arrives, and what
// the strip shows measured on the way: time to first audio, first sound, the stall meter.

import { ServerError, call, sseEvents } from "./api.js";
import { base64Bytes } from "./bytes.js";
import { heardFile } from "./heard_file.js";
import { MediaSourcePlayer, mediaSourcePlays } from "./media_player.js";
import { sampleDecoder } from "./sample_decoders.js";
import { StallMeter } from "./stall_meter.js";

export const DEFAULT_RATES_HZ = { pcm: 24000, wav: 24000, ulaw: 8000, alaw: 8000, mp3: 24000,
  opus: 24000, aac: 24000, flac: 24000 };

/** How the page plays `format` here: "Web Audio", "Media Source" or "file". */
export function playPath(format) {
  if (sampleDecoder(format)) return "Web Audio";
  return mediaSourcePlays(format) ? "Media Source" : "file";
}

export class Utterance {
  /** body: the request's JSON; pcmPlayer: the page's PcmPlayer (opened by the caller in the
   * click); media: the <audio> element; words: the WordHighlighter. */
  constructor(body, { pcmPlayer, media, words }) {
    this.body = body;
    this.format = body.response_format;
    this.path = playPath(this.format);
    this.pcmPlayer = pcmPlayer;
    this.media = media;
    this.words = words;
    this.meter = new StallMeter();
    this.rateHz = DEFAULT_RATES_HZ[this.format];
    this.chunks = [];
    this.ttfaMs = null; // request sent -> first audio bytes
    this.firstSoundMs = null; // request sent -> the first sample plays
    this.doneMs = null; // request sent -> the stream's last event
    this.done = false;
    this.finishReason = null;
    this.error = null;
    this.controller = new AbortController();
  }

  async run() {
    this.startedAt = performance.now();
    try {
      // the player gets ready while the server makes the first audio
      const [response] = await Promise.all([
        call("/v1/audio/speech", { method: "POST", json: this.body, signal: this.controller.signal }),
        this.openPlayer(),
      ]);
      await this.checkRate(Number(response.headers.get("X-Sample-Rate")));
      for await (const event of sseEvents(response)) this.event(event);
      if (this.mediaPlayer) this.mediaPlayer.end();
      this.doneMs = performance.now() - this.startedAt;
      if (this.path === "file") await this.playFile();
      this.done = true;
    } catch (error) {
      if (error.name !== "AbortError") this.error = error;
      throw error;
    }
  }

  async openPlayer() {
    if (this.path === "Web Audio") {
      this.decoder = sampleDecoder(this.format);
      await this.pcmPlayer.open(this.rateHz);
    } else if (this.path === "Media Source") {
      this.mediaPlayer = new MediaSourcePlayer(this.media, this.format,
        (seconds) => this.meter.arrived(performance.now() / 1000, seconds));
      await this.mediaPlayer.open();
    }
  }

  /** The stream's rate as the server states it (the Web Audio player opened at the format's usual one). */
  async checkRate(rateHz) {
    if (!rateHz || rateHz === this.rateHz) return;
    this.rateHz = rateHz;
    if (this.path === "Web Audio") await this.pcmPlayer.open(rateHz);
  }

  event(event) {
    if (event.type === "speech.audio.delta") this.audio(base64Bytes(event.audio));
    else if (event.type === "speech.words") this.words.add(event);
    else if (event.type === "speech.audio.done") this.finishReason = event.finish_reason;
    else if (event.type === "speech.audio.error") throw new ServerError(0, event.error); // mid-stream: no HTTP status
  }

  audio(bytes) {
    if (!bytes.length) return;
    if (this.ttfaMs === null) this.ttfaMs = performance.now() - this.startedAt;
    this.chunks.push(bytes);
    if (this.path === "Web Audio") {
      const samples = this.decoder.decode(bytes);
      if (!samples.length) return;
      const start = this.pcmPlayer.play(samples);
      this.meter.arrived(performance.now() / 1000, samples.length / this.rateHz);
      if (this.firstSoundMs === null) this.firstSoundMs = this.pcmPlayer.wallMs(start) - this.startedAt;
    } else if (this.path === "Media Source") {
      this.mediaPlayer.push(bytes);
    }
  }

  async playFile() {
    this.media.src = URL.createObjectURL(this.heard().blob);
    this.media.addEventListener("playing", () => {
      if (this.firstSoundMs === null) this.firstSoundMs = performance.now() - this.startedAt;
    }, { once: true });
    await this.media.play();
  }

  heard() {
    return heardFile(this.format, this.chunks, this.rateHz);
  }

  stop() {
    this.controller.abort();
    if (this.mediaPlayer) this.mediaPlayer.stop();
    if (this.path === "file") this.media.pause();
  }

  /** Where playback is in the audio (seconds), for the word highlights. */
  positionS() {
    if (this.path === "Web Audio") return this.pcmPlayer.positionS();
    if (this.mediaPlayer) return this.mediaPlayer.positionS();
    return this.media.currentTime;
  }

  aheadS() {
    if (this.path === "Web Audio") return this.pcmPlayer.aheadS();
    return this.mediaPlayer ? this.mediaPlayer.aheadS() : 0;
  }

  /** What the strip shows, and what the browser tests read. */
  state() {
    const media = this.mediaPlayer;
    if (media && media.firstSoundAt !== null && this.firstSoundMs === null) {
      this.firstSoundMs = media.firstSoundAt - this.startedAt;
    }
    const player = this.pcmPlayer;
    return {
      format: this.format, path: this.path, ttfaMs: this.ttfaMs, firstSoundMs: this.firstSoundMs,
      doneMs: this.doneMs,
      done: this.done, finishReason: this.finishReason, error: this.error && this.error.message,
      receivedBytes: this.chunks.reduce((n, c) => n + c.length, 0),
      aheadS: this.aheadS(), gaps: this.meter.gaps, longestMs: 1000 * this.meter.longestS,
      behindMs: 1000 * this.meter.behindS, stalled: this.meter.stalled,
      contextState: player.context ? player.context.state : null,
      scheduledSamples: this.path === "Web Audio" ? player.scheduledSamples : 0,
      pieces: this.path === "Web Audio" ? player.pieces : 0,
      holesMs: this.path === "Web Audio" ? player.holes.map((s) => 1000 * s) : [],
      appends: media ? media.appends : 0, appendedBytes: media ? media.appendedBytes : 0,
      bufferedS: media ? media.bufferedEndS : 0, mediaError: media && media.error && String(media.error),
      words: this.words.words.length, highlighted: this.words.highlighted,
    };
  }
}
