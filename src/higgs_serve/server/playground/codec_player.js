// mp3, opus and aac through WebCodecs: each frame (mp3, aac) or Opus packet (out of the Ogg pages)
// goes to the browser's AudioDecoder the moment its last byte arrives, and each decoded piece is
// scheduled on the pcm path's Web Audio player (pcm_player.js), sample after sample. So the first
// sound comes with the first frame that decodes to speech, where Media Source waits for about
// 0.2 s of it (media_player.js, still the path where AudioDecoder is missing: not every browser
// has it, and it needs a secure context, https or localhost).
//
// What is scheduled is the signal the server encoded: the codec's lead-in (an encoder's priming
// samples, Opus's pre-skip) is dropped, so the first scheduled sample is the speech's first, the
// word highlights keep the server's timeline, and an Ogg stream ends where its last page says.

import { adtsFrames, mp3Frames } from "./mpeg_frames.js";
import { OPUS_RATE_HZ, OpusPackets } from "./ogg_opus.js";

const FORMATS = {
  mp3: { frames: mp3Frames, probe: { codec: "mp3", sampleRate: 24000, numberOfChannels: 1 } },
  aac: { frames: adtsFrames, probe: { codec: "mp4a.40.2", sampleRate: 24000, numberOfChannels: 1 } },
  opus: { frames: () => new OpusPackets(), probe: { codec: "opus", sampleRate: OPUS_RATE_HZ, numberOfChannels: 1 } },
};
const supported = new Set(); // the formats this browser's AudioDecoder takes (probeWebCodecs)

/** Asks the browser which formats its AudioDecoder decodes (once, as the page loads: the answer
 * is a promise, and Speak must choose its path in the click). */
export async function probeWebCodecs() {
  if (typeof AudioDecoder === "undefined") return;
  await Promise.all(Object.entries(FORMATS).map(async ([format, { probe }]) => {
    const { supported: yes } = await AudioDecoder.isConfigSupported(probe).catch(() => ({ supported: false }));
    if (yes) supported.add(format);
  }));
}

/** Whether this browser plays `format` through WebCodecs (after probeWebCodecs). */
export function webCodecsPlays(format) {
  return supported.has(format);
}

/** The rate the decoder gives `format` at, for a stream at `streamRateHz`: the player's context
 * runs at it (Opus decodes at 48 kHz whatever it was encoded at; Chromium does). */
export function decodedRateHz(format, streamRateHz) {
  return format === "opus" ? OPUS_RATE_HZ : streamRateHz;
}

export class CodecPlayer {
  /** pcmPlayer: opened by the caller at decodedRateHz; onPlayed(samples, startTime): each
   * decoded piece as the player scheduled it. */
  constructor(format, pcmPlayer, onPlayed) {
    this.format = format;
    this.frames = FORMATS[format].frames();
    this.player = pcmPlayer;
    this.onPlayed = onPlayed;
    this.decoder = new AudioDecoder({ output: (data) => this.decoded(data), error: (error) => this.failed(error) });
    this.sentSamples = 0; // at the config's rate: the next chunk's timestamp
    this.chunks = 0; // frames or packets handed to the decoder
    this.decodedSamples = 0; // at the decoded rate, lead-in included
    this.droppedSamples = 0; // the lead-in and any padding past the stream's stated end
    this.scheduling = Promise.resolve(); // decoded pieces reach the player in order
    this.error = null;
    this.stopped = false;
  }

  /** Bytes of the stream, as they arrived. */
  push(bytes) {
    if (this.error) throw this.error;
    for (const { data, samples } of this.frames.push(bytes)) {
      const config = this.frames.config;
      if (this.decoder.state === "unconfigured") this.decoder.configure(config);
      const timestamp = Math.round((this.sentSamples * 1e6) / config.sampleRate); // microseconds
      this.decoder.decode(new EncodedAudioChunk({ type: "key", timestamp, data }));
      this.sentSamples += samples;
      this.chunks += 1;
    }
  }

  /** The stream has ended: what the decoder still holds is played; throws a decode error. */
  async end() {
    if (this.decoder.state === "configured") await this.decoder.flush().catch(() => {}); // failed() has the reason
    await this.scheduling;
    if (this.error) throw this.error;
    if (this.decoder.state !== "closed") this.decoder.close();
  }

  decoded(data) {
    const rateHz = data.sampleRate;
    const samples = new Float32Array(data.numberOfFrames);
    data.copyTo(samples, { planeIndex: 0, format: "f32-planar" }); // the server's streams are mono
    data.close();
    const kept = this.trim(samples, rateHz);
    this.scheduling = this.scheduling.then(() => this.schedule(kept, rateHz)).catch((error) => this.failed(error));
  }

  /** `samples` less the lead-in before the first sample pushed and anything past the stated end. */
  trim(samples, rateHz) {
    const { config, primingSamples, lengthSamples } = this.frames;
    const scale = rateHz / config.sampleRate; // 1, unless a decoder resamples
    const start = Math.max(0, Math.round(primingSamples * scale) - this.decodedSamples);
    const end = lengthSamples === null ? samples.length
      : Math.max(0, Math.round((primingSamples + lengthSamples) * scale) - this.decodedSamples);
    this.decodedSamples += samples.length;
    const kept = samples.subarray(Math.min(start, samples.length), Math.min(end, samples.length));
    this.droppedSamples += samples.length - kept.length;
    return kept;
  }

  async schedule(samples, rateHz) {
    if (this.stopped || !samples.length) return;
    if (rateHz !== this.player.context.sampleRate) {
      // the context runs at the decoded rate, set before the first piece (decodedRateHz)
      if (this.player.pieces) throw new Error(`the ${this.format} decoder changed its rate to ${rateHz} Hz mid-stream`);
      await this.player.open(rateHz);
    }
    this.onPlayed(samples, this.player.play(samples));
  }

  failed(error) {
    if (this.stopped || this.error) return;
    this.error = new Error(`this browser could not decode the ${this.format} stream: ${error.message || error}`);
  }

  stop() {
    this.stopped = true;
    if (this.decoder.state !== "closed") this.decoder.close();
  }
}
