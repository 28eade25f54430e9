// Samples through Web Audio, scheduled sample-accurately. The AudioContext runs at the stream's
// own rate, so every piece is a whole number of the context's frames: each AudioBuffer starts on
// the exact frame where the one before it ends (no gap, no overlap, no resampling seam). A piece
// that arrives after the player ran dry starts at once: the player the stall meter models.

export class PcmPlayer {
  constructor() {
    this.context = null;
    this.opening = Promise.resolve(); // opens run one after another (one context at a time)
    this.sources = new Set();
    this.reset();
  }

  reset() {
    this.nextFrame = null; // the context frame where the next piece starts
    this.timeline = []; // [context time it starts, audio seconds before it, its seconds]
    this.scheduledSamples = 0;
    this.pieces = 0;
    this.firstStart = null; // context time of the first sample
    this.holes = []; // seconds of silence between pieces (the player ran dry), as scheduled
  }

  /** Ready to play at `rateHz` (call in the click that starts playback: browsers let a page
   * start audio from a user's gesture). */
  open(rateHz) {
    this.opening = this.opening.then(async () => {
      if (!this.context || this.context.sampleRate !== rateHz) {
        if (this.context) await this.context.close();
        this.context = new AudioContext({ sampleRate: rateHz, latencyHint: "interactive" });
      }
      await this.context.resume();
    });
    return this.opening;
  }

  /** Play `samples` (Float32Array, the context's rate) right after what was scheduled, or now. */
  play(samples) {
    if (!samples.length) return;
    const context = this.context;
    const rate = context.sampleRate;
    const nowFrame = Math.ceil(context.currentTime * rate);
    const startFrame = this.nextFrame === null ? nowFrame : Math.max(this.nextFrame, nowFrame);
    if (this.nextFrame !== null && startFrame > this.nextFrame) this.holes.push((startFrame - this.nextFrame) / rate);
    const buffer = context.createBuffer(1, samples.length, rate);
    buffer.copyToChannel(samples, 0);
    const source = context.createBufferSource();
    source.buffer = buffer;
    source.connect(context.destination);
    source.onended = () => this.sources.delete(source);
    source.start(startFrame / rate);
    this.sources.add(source);
    const startTime = startFrame / rate;
    if (this.firstStart === null) this.firstStart = startTime;
    this.timeline.push([startTime, this.scheduledSamples / rate, samples.length / rate]);
    this.nextFrame = startFrame + samples.length;
    this.scheduledSamples += samples.length;
    this.pieces += 1;
    return startTime;
  }

  /** Seconds scheduled and not yet played. */
  aheadS() {
    if (!this.context || this.nextFrame === null) return 0;
    return Math.max(0, this.nextFrame / this.context.sampleRate - this.context.currentTime);
  }

  /** Where playback is in the audio (seconds from its first sample), or null before it starts. */
  positionS() {
    if (!this.context || this.firstStart === null) return null;
    const now = this.context.currentTime;
    let position = null;
    for (const [start, before, length] of this.timeline) {
      if (start > now) break;
      position = before + Math.min(now - start, length);
    }
    return position;
  }

  /** performance.now() of a context time (for the strip's first-sound time). */
  wallMs(contextTime) {
    return performance.now() + (contextTime - this.context.currentTime) * 1000;
  }

  stop() {
    for (const source of this.sources) source.stop();
    this.sources.clear();
    this.reset();
  }
}
