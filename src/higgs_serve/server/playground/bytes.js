// Bytes as the page handles them: pieces joined, base64 (SSE's audio) decoded, and whole units
// (Ogg pages, mp3 and AAC frames) cut from a stream that arrives in pieces of any size.

export function concat(parts) {
  const out = new Uint8Array(parts.reduce((n, part) => n + part.length, 0));
  let at = 0;
  for (const part of parts) {
    out.set(part, at);
    at += part.length;
  }
  return out;
}

export function base64Bytes(text) {
  const binary = atob(text);
  const bytes = new Uint8Array(binary.length);
  for (let i = 0; i < binary.length; i++) bytes[i] = binary.charCodeAt(i);
  return bytes;
}

/** Cuts a byte stream into the units its headers delimit. `lengthAt(bytes, at)` reads the header
 * of the unit starting at `at`: its whole length in bytes, null when the header is not all
 * there yet, or it throws (no unit starts there). A unit split between pieces waits for the rest. */
export class UnitCutter {
  constructor(lengthAt) {
    this.lengthAt = lengthAt;
    this.rest = new Uint8Array(0); // the start of a unit still incomplete
    this.offset = 0; // bytes of the stream before `rest` (for errors)
  }

  /** The units `bytes` completes (views into one buffer, in stream order). */
  push(bytes) {
    const buffer = this.rest.length ? concat([this.rest, bytes]) : bytes;
    const units = [];
    let at = 0;
    for (;;) {
      let length;
      try {
        length = this.lengthAt(buffer, at);
      } catch (error) {
        throw new Error(`${error.message} (at byte ${this.offset + at} of the stream)`);
      }
      if (length === null || at + length > buffer.length) break;
      units.push(buffer.subarray(at, at + length));
      at += length;
    }
    this.rest = buffer.slice(at);
    this.offset += at;
    return units;
  }
}
