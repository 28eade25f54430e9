// The formats Web Audio plays from their samples, decoded piece by piece as they arrive: pcm
// (s16le), a streamed wav (its header, then s16le) and G.711 (ulaw, alaw: a byte a sample).
// Each `decode(bytes)` returns the whole samples it completes (a sample split between two
// pieces waits for the second) as Float32Array.

class S16Decoder {
  constructor() {
    this.carry = null; // an odd byte left from the last piece
  }

  decode(bytes) {
    if (this.carry !== null) {
      const joined = new Uint8Array(bytes.length + 1);
      joined[0] = this.carry;
      joined.set(bytes, 1);
      bytes = joined;
      this.carry = null;
    }
    if (bytes.length % 2) {
      this.carry = bytes[bytes.length - 1];
      bytes = bytes.subarray(0, bytes.length - 1);
    }
    const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.length);
    const samples = new Float32Array(bytes.length / 2);
    for (let i = 0; i < samples.length; i++) samples[i] = view.getInt16(2 * i, true) / 32768;
    return samples;
  }
}

/** A streamed wav: RIFF chunks up to `data` (its sizes unknown, 0xFFFFFFFF), then s16le. */
class WavDecoder extends S16Decoder {
  constructor() {
    super();
    this.header = new Uint8Array(0);
    this.inData = false;
  }

  decode(bytes) {
    if (this.inData) return super.decode(bytes);
    const joined = new Uint8Array(this.header.length + bytes.length);
    joined.set(this.header);
    joined.set(bytes, this.header.length);
    const view = new DataView(joined.buffer);
    let at = 12; // "RIFF" size "WAVE"
    while (at + 8 <= joined.length) {
      const id = String.fromCharCode(...joined.subarray(at, at + 4));
      if (id === "data") {
        this.inData = true;
        return super.decode(joined.subarray(at + 8));
      }
      at += 8 + view.getUint32(at + 4, true);
    }
    this.header = joined; // the header is not complete yet
    return new Float32Array(0);
  }
}

function g711Table(expand) {
  const table = new Float32Array(256);
  for (let byte = 0; byte < 256; byte++) table[byte] = expand(byte) / 32768;
  return table;
}

// ITU-T G.711 expansions (the inverse of audio/encoders/pcm.py's tables)
const ULAW = g711Table((byte) => {
  const u = ~byte & 0xff;
  const magnitude = ((((u & 0x0f) << 3) + 0x84) << ((u & 0x70) >> 4)) - 0x84;
  return u & 0x80 ? -magnitude : magnitude;
});
const ALAW = g711Table((byte) => {
  const a = byte ^ 0x55;
  const exponent = (a & 0x70) >> 4;
  let magnitude = (a & 0x0f) << 4;
  magnitude = exponent === 0 ? magnitude + 8 : (magnitude + 0x108) << (exponent - 1);
  return a & 0x80 ? magnitude : -magnitude;
});

class G711Decoder {
  constructor(table) {
    this.table = table;
  }

  decode(bytes) {
    const samples = new Float32Array(bytes.length);
    for (let i = 0; i < bytes.length; i++) samples[i] = this.table[bytes[i]];
    return samples;
  }
}

const DECODERS = {
  pcm: () => new S16Decoder(),
  wav: () => new WavDecoder(),
  ulaw: () => new G711Decoder(ULAW),
  alaw: () => new G711Decoder(ALAW),
};

/** A decoder for `format`, or null when Web Audio does not play it from samples here. */
export function sampleDecoder(format) {
  return DECODERS[format] ? DECODERS[format]() : null;
}
