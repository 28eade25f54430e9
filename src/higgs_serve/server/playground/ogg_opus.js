// Ogg/Opus as the server streams it (audio/encoders/ogg_opus.py, RFC 7845): one Ogg page per
// chunk, the first holding the OpusHead, the second the OpusTags, then audio packets; the last
// page's granule position is the exact end. Read here once for both players that take it apart:
// Media Source's rewrap into WebM (ogg_webm.js) and WebCodecs (codec_player.js, OpusPackets).

import { UnitCutter, concat } from "./bytes.js";

export const OPUS_RATE_HZ = 48000; // Opus timestamps count 48 kHz samples at any rate
const EOS = 0x04; // the page header's end-of-stream flag

/** 48 kHz samples in one Opus packet, from its TOC byte (RFC 6716 section 3.1). */
export function opusPacketSamples(packet) {
  const toc = packet[0];
  const config = toc >> 3;
  let frame;
  if (config < 12) frame = [480, 960, 1920, 2880][config & 3]; // SILK: 10, 20, 40, 60 ms
  else if (config < 16) frame = [480, 960][config & 1]; // hybrid: 10, 20 ms
  else frame = [120, 240, 480, 960][config & 3]; // CELT: 2.5, 5, 10, 20 ms
  const code = toc & 3;
  const frames = code === 0 ? 1 : code === 3 ? packet[1] & 0x3f : 2;
  return frame * frames;
}

/** The OpusHead's fields the players use (RFC 7845 section 5.1). */
export function opusHead(packet) {
  if (String.fromCharCode(...packet.subarray(0, 8)) !== "OpusHead") {
    throw new Error("the opus stream does not start with an OpusHead");
  }
  return { channels: packet[9], preSkip: packet[10] | (packet[11] << 8) };
}

/** The length of the Ogg page at `at` (UnitCutter's contract). */
function pageLength(b, at) {
  if (b.length - at < 27) return null;
  if (b[at] !== 0x4f || b[at + 1] !== 0x67 || b[at + 2] !== 0x67 || b[at + 3] !== 0x53) {
    throw new Error("the opus stream is not Ogg (no OggS page where one should start)");
  }
  const segments = b[at + 26];
  if (b.length - at < 27 + segments) return null;
  let length = 27 + segments;
  for (let i = 0; i < segments; i++) length += b[at + 27 + i];
  return length;
}

export class OggOpusReader {
  constructor() {
    this.pages = new UnitCutter(pageLength);
    this.partial = []; // pieces of a packet continued on the next page
    this.packets = 0; // packets seen (OpusHead, OpusTags, then audio)
  }

  /** Bytes of the Ogg stream in; each page they complete out, as {head: the OpusHead packet if
   * the page ends it (else null), audio: the audio packets that end on it, granule: its granule
   * position, last: whether it ends the stream}. */
  push(bytes) {
    return this.pages.push(bytes).map((page) => this.read(page));
  }

  read(page) {
    const segments = page[26];
    const granule = Number(new DataView(page.buffer, page.byteOffset).getBigInt64(6, true));
    const out = { head: null, audio: [], granule, last: Boolean(page[5] & EOS) };
    let at = 27 + segments;
    for (const value of page.subarray(27, 27 + segments)) {
      this.partial.push(page.subarray(at, at + value));
      at += value;
      if (value === 255) continue; // the packet goes on in the next segment
      const packet = concat(this.partial);
      this.partial = [];
      this.packets += 1;
      if (this.packets === 1) out.head = packet;
      else if (this.packets > 2) out.audio.push(packet); // the second is OpusTags
    }
    return out;
  }
}

/** Opus packets for an AudioDecoder, with mpeg_frames.js's interface: `push(bytes)` gives
 * [{data, samples}] (samples at `config.sampleRate`), `config` once the OpusHead has arrived
 * (it goes to the decoder as `description`: Chromium then drops the pre-skip itself, measured:
 * its first output is 960 − 312 samples), `lengthSamples` once the last page says the exact end. */
export class OpusPackets {
  constructor() {
    this.reader = new OggOpusReader();
    this.config = null;
    this.lengthSamples = null;
    this.primingSamples = 0; // the decoder trims the pre-skip (above)
  }

  push(bytes) {
    const units = [];
    for (const page of this.reader.push(bytes)) {
      if (page.head) {
        const { channels, preSkip } = opusHead(page.head);
        this.preSkip = preSkip;
        this.config = { codec: "opus", sampleRate: OPUS_RATE_HZ, numberOfChannels: channels, description: page.head };
      }
      for (const packet of page.audio) units.push({ data: packet, samples: opusPacketSamples(packet) });
      if (page.last) this.lengthSamples = page.granule - this.preSkip;
    }
    return units;
  }
}
