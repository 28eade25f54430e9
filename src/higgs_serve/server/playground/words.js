// Word timestamps shown as the audio plays: each `speech.words` event (a sentence's words on the
// response's audio timeline, docs/api.md#word-timestamps) adds its words to the page, and the
// word whose span holds the player's position is marked `now` (the ones before it `spoken`).

export class WordHighlighter {
  constructor(container) {
    this.container = container;
    this.clear();
  }

  clear() {
    this.container.replaceChildren();
    this.words = []; // [start s, end s, span]
    this.highlighted = 0; // words marked `now` at least once (tests read it)
    this.failedSentences = 0;
  }

  /** One `speech.words` event. */
  add(event) {
    if (!event.words) {
      this.failedSentences += 1; // its alignment failed: the audio is unaffected
      return;
    }
    for (const { word, start_ms: startMs, end_ms: endMs } of event.words) {
      const span = document.createElement("span");
      span.textContent = word;
      if (startMs !== null) span.title = `${(startMs / 1000).toFixed(2)}–${(endMs / 1000).toFixed(2)} s`;
      this.container.append(span, " ");
      if (startMs !== null) this.words.push([startMs / 1000, endMs / 1000, span]);
    }
  }

  /** The player is at `positionS` of the audio (null: not playing yet). */
  show(positionS) {
    if (positionS === null) return;
    for (const [start, end, span] of this.words) {
      const now = start <= positionS && positionS < end;
      if (now && !span.classList.contains("now")) this.highlighted += 1;
      span.classList.toggle("now", now);
      span.classList.toggle("spoken", end <= positionS);
    }
  }
}
