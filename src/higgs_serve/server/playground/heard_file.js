// "Download what was heard": the bytes that arrived, as a file a player opens. Formats without
// a header (pcm, ulaw, alaw) get a wav header (PCM, mu-law or A-law); a streamed wav, whose
// header could not know its length, gets its sizes written in; the others are files as sent.

import { concat } from "./bytes.js";

const WAV_CODES = { pcm: [1, 16], ulaw: [7, 8], alaw: [6, 8] }; // format tag, bits per sample
const FILES = {
  mp3: ["mp3", "audio/mpeg"], opus: ["ogg", "audio/ogg"], aac: ["aac", "audio/aac"],
  flac: ["flac", "audio/flac"], wav: ["wav", "audio/wav"],
};

function wavHeader(format, rateHz, dataBytes) {
  const [tag, bits] = WAV_CODES[format];
  const header = new DataView(new ArrayBuffer(44));
  const ascii = (at, text) => [...text].forEach((c, i) => header.setUint8(at + i, c.charCodeAt(0)));
  ascii(0, "RIFF");
  header.setUint32(4, 36 + dataBytes, true);
  ascii(8, "WAVE");
  ascii(12, "fmt ");
  header.setUint32(16, 16, true);
  header.setUint16(20, tag, true);
  header.setUint16(22, 1, true); // mono
  header.setUint32(24, rateHz, true);
  header.setUint32(28, (rateHz * bits) / 8, true);
  header.setUint16(32, bits / 8, true);
  header.setUint16(34, bits, true);
  ascii(36, "data");
  header.setUint32(40, dataBytes, true);
  return new Uint8Array(header.buffer);
}

/** A streamed wav's RIFF and data sizes set to what arrived (they were 0xFFFFFFFF). */
function sizedWav(bytes) {
  const view = new DataView(bytes.buffer);
  view.setUint32(4, bytes.length - 8, true);
  for (let at = 12; at + 8 <= bytes.length; at += 8 + view.getUint32(at + 4, true)) {
    if (String.fromCharCode(...bytes.subarray(at, at + 4)) === "data") {
      view.setUint32(at + 4, bytes.length - at - 8, true);
      break;
    }
  }
  return bytes;
}

/** {blob, name} of the audio that arrived in `format` at `rateHz`. */
export function heardFile(format, chunks, rateHz) {
  const bytes = concat(chunks);
  if (WAV_CODES[format]) {
    return { blob: new Blob([wavHeader(format, rateHz, bytes.length), bytes], { type: "audio/wav" }), name: "heard.wav" };
  }
  const [suffix, type] = FILES[format];
  return { blob: new Blob([format === "wav" ? sizedWav(bytes) : bytes], { type }), name: `heard.${suffix}` };
}
