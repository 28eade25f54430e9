// Ogg/Opus in, WebM out, page by page: browsers that play Opus through Media Source take it in
// WebM (Chromium's Media Source has no Ogg), so each Ogg page the server sends (one per chunk,
// audio/encoders/ogg_opus.py) becomes a WebM cluster holding the same Opus packets, unchanged.
// The first output is WebM's header: the track, with the OpusHead as its CodecPrivate and its
// pre-skip as CodecDelay (Matroska's Opus mapping).

import { concat } from "./bytes.js";

const OPUS_RATE_HZ = 48000; // Opus timestamps count 48 kHz samples at any rate
const SEEK_PRE_ROLL_NS = 80e6; // 80 ms, RFC 7845

// ------------------------------------------------------------------------------ EBML writing
function bigEndian(value, width) {
  const out = new Uint8Array(width);
  for (let i = width - 1; i >= 0; i--) {
    out[i] = value % 256;
    value = Math.floor(value / 256);
  }
  return out;
}

function uintBytes(value) {
  let width = 1;
  while (value >= 256 ** width) width++;
  return bigEndian(value, width);
}

const UNKNOWN_SIZE = new Uint8Array([0x01, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff]);

/** An element: its ID (marker bits included), its size as an 8-byte vint, its payload. */
function element(id, payload) {
  const size = bigEndian(payload.length, 8);
  size[0] = 0x01;
  return concat([uintBytes(id), size, payload]);
}

const uint = (id, value) => element(id, uintBytes(value));
const text = (id, value) => element(id, new TextEncoder().encode(value));

function float64(id, value) {
  const payload = new Uint8Array(8);
  new DataView(payload.buffer).setFloat64(0, value);
  return element(id, payload);
}

function webmHeader(opusHead) {
  const channels = opusHead[9];
  const preSkip = opusHead[10] | (opusHead[11] << 8);
  const ebml = element(0x1a45dfa3, concat([
    uint(0x4286, 1), uint(0x42f7, 1), uint(0x42f2, 4), uint(0x42f3, 8),
    text(0x4282, "webm"), uint(0x4287, 4), uint(0x4285, 2),
  ]));
  const info = element(0x1549a966, concat([
    uint(0x2ad7b1, 1e6), // TimecodeScale: timestamps in milliseconds
    text(0x4d80, "higgs-serve playground"), text(0x5741, "higgs-serve playground"),
  ]));
  const track = element(0xae, concat([
    uint(0xd7, 1), uint(0x73c5, 1), uint(0x83, 2), // TrackNumber, TrackUID, TrackType audio
    text(0x86, "A_OPUS"), element(0x63a2, opusHead),
    uint(0x56aa, Math.round((preSkip * 1e9) / OPUS_RATE_HZ)), uint(0x56bb, SEEK_PRE_ROLL_NS),
    element(0xe1, concat([float64(0xb5, OPUS_RATE_HZ), uint(0x9f, channels)])),
  ]));
  const segmentStart = concat([uintBytes(0x18538067), UNKNOWN_SIZE]);
  return concat([ebml, segmentStart, info, element(0x1654ae6b, track)]);
}

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

// ------------------------------------------------------------------------------ Ogg reading
export class OggToWebm {
  constructor() {
    this.buffer = new Uint8Array(0);
    this.partial = []; // pieces of a packet continued on the next page
    this.packets = 0; // packets seen (OpusHead, OpusTags, then audio)
    this.samples = 0; // 48 kHz samples of the audio packets so far
  }

  /** Bytes of the Ogg stream in; WebM bytes out (maybe none: an incomplete page waits). */
  push(bytes) {
    this.buffer = concat([this.buffer, bytes]);
    const out = [];
    for (let page; (page = this.nextPage()); ) {
      const audio = [];
      for (const packet of page) {
        this.packets += 1;
        if (this.packets === 1) out.push(webmHeader(packet));
        else if (this.packets > 2) audio.push(packet); // the second is OpusTags
      }
      if (audio.length) {
        out.push(this.cluster(audio));
      }
    }
    return concat(out);
  }

  cluster(packets) {
    const startMs = Math.round((this.samples * 1000) / OPUS_RATE_HZ);
    const parts = [uint(0xe7, startMs)]; // Timecode
    for (const packet of packets) {
      const relativeMs = Math.round((this.samples * 1000) / OPUS_RATE_HZ) - startMs;
      const head = new Uint8Array([0x81, (relativeMs >> 8) & 0xff, relativeMs & 0xff, 0x80]); // track 1, keyframe
      parts.push(element(0xa3, concat([head, packet]))); // SimpleBlock
      this.samples += opusPacketSamples(packet);
    }
    return element(0x1f43b675, concat(parts)); // Cluster
  }

  /** The packets completed by the next whole page in the buffer, or null. */
  nextPage() {
    const b = this.buffer;
    if (b.length < 27) return null;
    if (b[0] !== 0x4f || b[1] !== 0x67 || b[2] !== 0x67 || b[3] !== 0x53) {
      throw new Error("the opus stream is not Ogg (no OggS page where one should start)");
    }
    const segments = b[26];
    if (b.length < 27 + segments) return null;
    const lacing = b.subarray(27, 27 + segments);
    const size = lacing.reduce((n, v) => n + v, 0);
    const end = 27 + segments + size;
    if (b.length < end) return null;
    const packets = [];
    let at = 27 + segments;
    for (const value of lacing) {
      this.partial.push(b.subarray(at, at + value));
      at += value;
      if (value < 255) {
        packets.push(concat(this.partial));
        this.partial = [];
      }
    }
    this.buffer = b.slice(end);
    return packets;
  }
}
