// One Speak: POST /v1/audio/speech as SSE (the audio, word timestamps and a mid-stream error
// arrive as events), each piece of audio handed to its player the moment it arrives, and what
// the strip shows measured on the way: time to first audio, first sound, the stall meter.
// Four paths: "Web Audio" (samples decoded here: pcm, wav, G.711), "WebCodecs" (mp3, opus, aac
// decoded by the browser's AudioDecoder, onto the same Web Audio player), "Media Source" (those
// three where AudioDecoder is missing) and "file" (the rest, once complete).

import { ServerError, call, sseEvents } from "./api.js";
import { base64Bytes } from "./bytes.js";
import { CodecPlayer, decodedRateHz, webCodecsPlays } from "./codec_player.js";
import { heardFile } from "./heard_file.js";
import { MediaSourcePlayer, mediaSourcePlays } from "./media_player.js";
import { sampleDecoder } from "./sample_decoders.js";
import { StallMeter } from "./stall_meter.js";

export const DEFAULT_RATES_HZ = { pcm: 24000, wav: 24000, ulaw: 8000, alaw: 8000, mp3: 24000,
  opus: 24000, aac: 24000, flac: 24000 };

/** How the page plays `format` here: "Web Audio", "WebCodecs", "Media Source" or "file". */
export function playPath(format) {
  if (sampleDecoder(format)) return "Web Audio";
  if (webCodecsPlays(format)) return "WebCodecs";
  return mediaSourcePlays(format) ? "Media Source" : "file";
}

/** The rate the Web Audio player runs at for `format` (a stream at `streamRateHz`), or null
 * when its path does not play through it. */
export function playerRateHz(format, streamRateHz = DEFAULT_RATES_HZ[format]) {
  const path = playPath(format);
  if (path === "Web Audio") return streamRateHz;
  return path === "WebCodecs" ? decodedRateHz(format, streamRateHz) : null;
}

export class Utterance {
  /** body: the request's JSON; pcmPlayer: the page's PcmPlayer (opened by the caller in the
   * click); media: the <audio> element; words: the WordHighlighter. */
  constructor(body, { pcmPlayer, media, words }) {
    this.body = body;
    this.format = body.response_format;
    this.path = playPath(this.format);
    this.webAudio = this.path === "Web Audio" || this.path === "WebCodecs"; // on the pcm player
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
      if (this.codecPlayer) await this.codecPlayer.end();
      this.doneMs = performance.now() - this.startedAt;
      if (this.path === "file") await this.playFile();
      this.done = true;
    } catch (error) {
      if (error.name !== "AbortError") this.error = error;
      throw error;
    }
  }

  async openPlayer() {
    if (this.path === "Web Audio") this.decoder = sampleDecoder(this.format);
    if (this.path === "WebCodecs") {
      this.codecPlayer = new CodecPlayer(this.format, this.pcmPlayer, (samples, start) => this.played(samples, start));
    }
    if (this.webAudio) {
      await this.pcmPlayer.open(playerRateHz(this.format, this.rateHz));
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
    if (this.webAudio) await this.pcmPlayer.open(playerRateHz(this.format, rateHz));
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
      if (samples.length) this.played(samples, this.pcmPlayer.play(samples));
    } else if (this.path === "WebCodecs") {
      this.codecPlayer.push(bytes);
    } else if (this.path === "Media Source") {
      this.mediaPlayer.push(bytes);
    }
  }

  /** `samples` (decoded here or by WebCodecs) were scheduled to start at context time `start`. */
  played(samples, start) {
    this.meter.arrived(performance.now() / 1000, samples.length / this.pcmPlayer.context.sampleRate);
    if (this.firstSoundMs === null) this.firstSoundMs = this.pcmPlayer.wallMs(start) - this.startedAt;
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
    if (this.codecPlayer) this.codecPlayer.stop();
    if (this.path === "file") this.media.pause();
  }

  /** Where playback is in the audio (seconds), for the word highlights. */
  positionS() {
    if (this.webAudio) return this.pcmPlayer.positionS();
    if (this.mediaPlayer) return this.mediaPlayer.positionS();
    return this.media.currentTime;
  }

  aheadS() {
    if (this.webAudio) return this.pcmPlayer.aheadS();
    return this.mediaPlayer ? this.mediaPlayer.aheadS() : 0;
  }

  /** What the strip shows, and what the browser tests read. */
  state() {
    const media = this.mediaPlayer;
    if (media && media.firstSoundAt !== null && this.firstSoundMs === null) {
      this.firstSoundMs = media.firstSoundAt - this.startedAt;
    }
    const player = this.pcmPlayer;
    const codec = this.codecPlayer;
    return {
      format: this.format, path: this.path, ttfaMs: this.ttfaMs, firstSoundMs: this.firstSoundMs,
      doneMs: this.doneMs,
      done: this.done, finishReason: this.finishReason, error: this.error && this.error.message,
      receivedBytes: this.chunks.reduce((n, c) => n + c.length, 0),
      aheadS: this.aheadS(), gaps: this.meter.gaps, longestMs: 1000 * this.meter.longestS,
      behindMs: 1000 * this.meter.behindS, stalled: this.meter.stalled,
      contextState: player.context ? player.context.state : null,
      contextRateHz: player.context ? player.context.sampleRate : null,
      scheduledSamples: this.webAudio ? player.scheduledSamples : 0,
      pieces: this.webAudio ? player.pieces : 0,
      holesMs: this.webAudio ? player.holes.map((s) => 1000 * s) : [],
      codecChunks: codec ? codec.chunks : 0, droppedSamples: codec ? codec.droppedSamples : 0,
      appends: media ? media.appends : 0, appendedBytes: media ? media.appendedBytes : 0,
      bufferedS: media ? media.bufferedEndS : 0, mediaError: media && media.error && String(media.error),
      words: this.words.words.length, highlighted: this.words.highlighted,
    };
  }
}
