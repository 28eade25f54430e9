// Ogg/Opus in, WebM out, page by page: browsers that play Opus through Media Source take it in
// WebM (Chromium's Media Source has no Ogg), so each Ogg page the server sends (one per chunk,
// audio/encoders/ogg_opus.py; read by ogg_opus.js) becomes a WebM cluster holding the same Opus
// packets, unchanged. The first output is WebM's header: the track, with the OpusHead as its
// CodecPrivate and its pre-skip as CodecDelay (Matroska's Opus mapping).

import { concat } from "./bytes.js";
import { OPUS_RATE_HZ, OggOpusReader, opusHead, opusPacketSamples } from "./ogg_opus.js";

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

function webmHeader(head) {
  const { channels, preSkip } = opusHead(head);
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
    text(0x86, "A_OPUS"), element(0x63a2, head),
    uint(0x56aa, Math.round((preSkip * 1e9) / OPUS_RATE_HZ)), uint(0x56bb, SEEK_PRE_ROLL_NS),
    element(0xe1, concat([float64(0xb5, OPUS_RATE_HZ), uint(0x9f, channels)])),
  ]));
  const segmentStart = concat([uintBytes(0x18538067), UNKNOWN_SIZE]);
  return concat([ebml, segmentStart, info, element(0x1654ae6b, track)]);
}

// ------------------------------------------------------------------------------ the rewrap
export class OggToWebm {
  constructor() {
    this.reader = new OggOpusReader();
    this.samples = 0; // 48 kHz samples of the audio packets so far
  }

  /** Bytes of the Ogg stream in; WebM bytes out (maybe none: an incomplete page waits). */
  push(bytes) {
    const out = [];
    for (const page of this.reader.push(bytes)) {
      if (page.head) out.push(webmHeader(page.head));
      if (page.audio.length) out.push(this.cluster(page.audio));
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
}
