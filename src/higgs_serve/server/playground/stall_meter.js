// What a listener hears, by the rule of the benchmarks (benchmarks/serving/playback.py
// `playback_stalls`) and of the server's higgs_serve_streams_stalled_total: a player starts at
// the first audio and plays at 1x; when it has played everything received it waits for the next
// audio (a stall), then plays on at once. A stall longer than STALL_S is a gap heard; a stream
// whose stalls add up to more than STALL_S is stalled (it fell more than 100 ms behind).
// tests/server/test_playground_browser.py feeds it arrivals and compares it with playback.py.

export const STALL_S = 0.1;

export class StallMeter {
  constructor() {
    this.stalls = []; // [seconds of audio played when it ran dry, seconds it waited]
    this.newStream();
  }

  /** A new stream starts (a WebSocket session's next sentence): the wait before its first
   * audio is no stall; the stalls so far are kept. */
  newStream() {
    this.playEnd = null; // when the player runs dry (seconds, the arrivals' clock)
    this.receivedS = 0;
  }

  /** `seconds` of audio arrived at `atS`. */
  arrived(atS, seconds) {
    if (!(seconds > 0)) return;
    if (this.playEnd === null) {
      this.playEnd = atS + seconds;
    } else if (atS > this.playEnd) {
      this.stalls.push([this.receivedS, atS - this.playEnd]);
      this.playEnd = atS + seconds;
    } else {
      this.playEnd += seconds;
    }
    this.receivedS += seconds;
  }

  /** Seconds of audio received and not yet played by the model player at `nowS`. */
  aheadS(nowS) {
    return this.playEnd === null ? 0 : Math.max(0, this.playEnd - nowS);
  }

  get gaps() {
    return this.stalls.filter(([, s]) => s > STALL_S).length;
  }

  get longestS() {
    return this.stalls.reduce((most, [, s]) => Math.max(most, s), 0);
  }

  get behindS() {
    return this.stalls.reduce((sum, [, s]) => sum + s, 0);
  }

  get stalled() {
    return this.behindS > STALL_S;
  }
}
