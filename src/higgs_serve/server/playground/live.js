// Streaming input over WS /v1/audio/speech/stream (docs/api.md#websocket-streaming-v1audiospeechstream):
// the text typed is sent as `input.text` pieces as it is typed, the server speaks each sentence
// once it is finished, and its pcm (binary messages) plays through the same Web Audio player
// as a Speak's, sentence after sentence. Only text added at the end can be sent: text already
// sent is the server's, so an edit before it is undone with a note.

import { ServerError, websocketUrl } from "./api.js";
import { sampleDecoder } from "./sample_decoders.js";
import { StallMeter } from "./stall_meter.js";

export class LiveSession {
  /** config: session.config fields (voice, seed, sampling); pcmPlayer: opened by the caller;
   * view: {onSentence(event), onSpoken(event), onDone(event), onError(error), onClosed()}. */
  constructor(config, pcmPlayer, view) {
    this.config = config;
    this.pcmPlayer = pcmPlayer;
    this.view = view;
    this.meter = new StallMeter();
    this.sent = ""; // the text the server has
    this.sentences = 0; // audio.start events
    this.spoken = 0; // audio.done events
    this.rateHz = 24000;
    this.error = null;
    this.startedAt = null;
    this.firstAudioMs = null; // session opened -> first audio
  }

  open() {
    this.startedAt = performance.now();
    this.socket = new WebSocket(websocketUrl("/v1/audio/speech/stream"));
    this.socket.binaryType = "arraybuffer";
    this.socket.onopen = () => this.send({ type: "session.config", response_format: "pcm", ...this.config });
    this.socket.onmessage = (message) => this.receive(message.data);
    this.socket.onclose = () => this.view.onClosed();
    return new Promise((resolve, reject) => {
      this.socket.addEventListener("open", resolve, { once: true });
      this.socket.addEventListener("error", () => reject(new Error("the WebSocket did not open")), { once: true });
    });
  }

  send(message) {
    this.socket.send(JSON.stringify(message));
  }

  /** The textarea now holds `text`; returns the text it must hold (what was sent stays). */
  typed(text) {
    if (!text.startsWith(this.sent)) return this.sent;
    const piece = text.slice(this.sent.length);
    if (piece) this.send({ type: "input.text", text: piece });
    this.sent = text;
    return text;
  }

  finish() {
    this.send({ type: "input.done" });
  }

  close() {
    if (this.socket && this.socket.readyState === WebSocket.OPEN) this.send({ type: "session.close" });
  }

  receive(data) {
    if (data instanceof ArrayBuffer) {
      const samples = this.decoder.decode(new Uint8Array(data));
      if (this.firstAudioMs === null) this.firstAudioMs = performance.now() - this.startedAt;
      this.pcmPlayer.play(samples);
      this.meter.arrived(performance.now() / 1000, samples.length / this.rateHz);
      return;
    }
    const event = JSON.parse(data);
    if (event.type === "audio.start") {
      this.sentences += 1;
      this.rateHz = event.sample_rate || this.rateHz;
      this.decoder = sampleDecoder("pcm");
      this.meter.newStream(); // the wait for a sentence still being typed is no gap
      this.view.onSentence(event);
    } else if (event.type === "audio.done") {
      this.spoken += 1;
      this.view.onSpoken(event);
    } else if (event.type === "error") {
      this.error = new ServerError(0, event.error || event);
      this.view.onError(this.error);
    } else if (event.type === "session.done") {
      this.view.onDone(event);
    }
  }

  state() {
    return { sent: this.sent.length, sentences: this.sentences, spoken: this.spoken,
      firstAudioMs: this.firstAudioMs, gaps: this.meter.gaps, error: this.error && this.error.message,
      scheduledSamples: this.pcmPlayer.scheduledSamples, contextState: this.pcmPlayer.context && this.pcmPlayer.context.state };
  }
}
