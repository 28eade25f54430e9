// Compressed streams through Media Source Extensions, where the browser has no WebCodecs
// AudioDecoder for them (codec_player.js, which sounds sooner): each piece of the stream is
// appended to a SourceBuffer as it arrives, and the media element plays what is buffered. mp3
// and aac are appended as they come (sequence mode: the browser times their frames); opus arrives
// in Ogg, which Media Source does not take, so it is rewrapped into WebM page by page (ogg_webm.js).
// Chromium's media element starts playing once about a quarter second is buffered (measured on
// Chromium 150: 0.22 s of mp3 never started, 0.29 s started at once), so its first sound waits
// for that much audio where Web Audio plays the first 40 ms chunk.

import { OggToWebm } from "./ogg_webm.js";

const OPUS_WEBM = 'audio/webm; codecs="opus"';
const KINDS = {
  mp3: { type: "audio/mpeg", mode: "sequence", rewrap: null },
  aac: { type: "audio/aac", mode: "sequence", rewrap: null },
  opus: { type: OPUS_WEBM, mode: "segments", rewrap: () => new OggToWebm() },
};

/** Whether this browser plays `format` through Media Source. */
export function mediaSourcePlays(format) {
  const kind = KINDS[format];
  return Boolean(kind && window.MediaSource && MediaSource.isTypeSupported(kind.type));
}

export class MediaSourcePlayer {
  /** `onAppended(seconds)`: each append's new audio, once the SourceBuffer took it. */
  constructor(element, format, onAppended) {
    this.element = element;
    this.kind = KINDS[format];
    this.rewrap = this.kind.rewrap ? this.kind.rewrap() : null;
    this.onAppended = onAppended;
    this.queue = [];
    this.appends = 0;
    this.appendedBytes = 0;
    this.bufferedEndS = 0;
    this.ended = false;
    this.firstSoundAt = null; // performance.now() when the element began to play
    this.error = null;
  }

  async open() {
    this.source = new MediaSource();
    this.url = URL.createObjectURL(this.source);
    this.element.src = this.url;
    await new Promise((resolve) => this.source.addEventListener("sourceopen", resolve, { once: true }));
    this.buffer = this.source.addSourceBuffer(this.kind.type);
    this.buffer.mode = this.kind.mode;
    this.buffer.addEventListener("updateend", () => this.appended());
    this.element.addEventListener("playing", () => {
      if (this.firstSoundAt === null) this.firstSoundAt = performance.now();
    }, { once: true });
    // starts as soon as the element has audio to play (autoplay: the click that led here)
    this.element.play().catch((error) => { this.error = error; });
  }

  push(bytes) {
    const data = this.rewrap ? this.rewrap.push(bytes) : bytes;
    if (data.length) this.queue.push(data);
    this.pump();
  }

  end() {
    this.ended = true;
    this.pump();
  }

  pump() {
    if (!this.buffer || this.buffer.updating || this.source.readyState !== "open") return;
    if (this.queue.length) {
      const data = this.queue.shift();
      this.appendedBytes += data.length;
      this.buffer.appendBuffer(data);
    } else if (this.ended) {
      this.source.endOfStream();
    }
  }

  appended() {
    this.appends += 1;
    const ranges = this.buffer.buffered;
    const end = ranges.length ? ranges.end(ranges.length - 1) : 0;
    if (end > this.bufferedEndS) {
      this.onAppended(end - this.bufferedEndS);
      this.bufferedEndS = end;
    }
    this.pump();
  }

  aheadS() {
    return Math.max(0, this.bufferedEndS - this.element.currentTime);
  }

  positionS() {
    return this.firstSoundAt === null ? null : this.element.currentTime;
  }

  stop() {
    this.element.pause();
    this.element.removeAttribute("src");
    this.element.load();
    if (this.url) URL.revokeObjectURL(this.url);
    this.queue = [];
  }
}
