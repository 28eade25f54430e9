// mp3 and AAC streams cut into whole frames for an AudioDecoder (WebCodecs), by their frame
// headers: every frame starts with a sync word and says its own length, so a frame is cut as
// soon as its last byte has arrived, whatever the network made of the pieces.
//
// Each framer: `push(bytes)` gives [{data, samples}] (samples: the frame's length at
// `config.sampleRate`), `config` (the AudioDecoderConfig, from the first header), `primingSamples`
// (the encoder's lead-in the decoder gives back before the first sample pushed; the stream does
// not say it, so the server's encoders' values: audio/encoders/__init__.py) and `lengthSamples`
// (null: these streams never say where the signal ends, so the last frame's padding is played).

import { UnitCutter } from "./bytes.js";

// ------------------------------------------------------------------------------ MPEG audio (mp3)
// ISO/IEC 11172-3 and 13818-3 Layer III: a 4-byte header, 11 sync bits first
const MP3_KBPS = {
  1: [0, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320], // MPEG-1
  2: [0, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160], // MPEG-2 and 2.5
};
const MP3_RATES_HZ = { 3: [44100, 48000, 32000], 2: [22050, 24000, 16000], 0: [11025, 12000, 8000] }; // by version bits
// LAME's delay: 576 samples it prepends, then the 529 of the decoder's filter bank (measured in
// Chromium: the decoded stream lags the samples pushed by exactly 1105)
const LAME_DELAY_SAMPLES = 576 + 529;

/** The header at `at`: {length, samples, rateHz, channels}; null before all 4 bytes are here. */
export function mp3Header(b, at) {
  if (b.length - at < 4) return null;
  const version = (b[at + 1] >> 3) & 3; // 3: MPEG-1, 2: MPEG-2, 0: MPEG-2.5
  const layer = (b[at + 1] >> 1) & 3; // 1: Layer III
  const bitrate = b[at + 2] >> 4;
  const rate = (b[at + 2] >> 2) & 3;
  if (b[at] !== 0xff || (b[at + 1] & 0xe0) !== 0xe0 || version === 1 || rate === 3) {
    throw new Error("the mp3 stream has no MPEG audio frame header where a frame should start");
  }
  if (layer !== 1 || bitrate === 0 || bitrate === 15) {
    throw new Error("the mp3 stream is not Layer III at a listed bit rate");
  }
  const mpeg1 = version === 3;
  const rateHz = MP3_RATES_HZ[version][rate];
  const samples = mpeg1 ? 1152 : 576;
  const padding = (b[at + 2] >> 1) & 1;
  const length = Math.floor((samples / 8) * MP3_KBPS[mpeg1 ? 1 : 2][bitrate] * 1000 / rateHz) + padding;
  return { length, samples, rateHz, channels: b[at + 3] >> 6 === 3 ? 1 : 2 };
}

// ------------------------------------------------------------------------------ ADTS (aac)
// ISO/IEC 13818-7 ADTS: a 7-byte header (9 with a CRC), 12 sync bits first; no description in the
// decoder's config means ADTS to WebCodecs
const ADTS_RATES_HZ = [96000, 88200, 64000, 48000, 44100, 32000, 24000, 22050, 16000, 12000, 11025, 8000, 7350];
const AAC_PRIMING_SAMPLES = 1024; // FFmpeg's AAC encoder (measured in Chromium: a lag of 1024)

export function adtsHeader(b, at) {
  if (b.length - at < 7) return null;
  if (b[at] !== 0xff || (b[at + 1] & 0xf6) !== 0xf0) {
    throw new Error("the aac stream has no ADTS frame header where a frame should start");
  }
  const rate = (b[at + 2] >> 2) & 0x0f;
  if (rate >= ADTS_RATES_HZ.length) throw new Error("the aac stream names no sample rate ADTS lists");
  return {
    length: ((b[at + 3] & 3) << 11) | (b[at + 4] << 3) | (b[at + 5] >> 5),
    samples: 1024 * ((b[at + 6] & 3) + 1), // raw data blocks of 1024 samples
    rateHz: ADTS_RATES_HZ[rate],
    channels: ((b[at + 2] & 1) << 2) | (b[at + 3] >> 6),
    objectType: (b[at + 2] >> 6) + 1, // the profile, plus one: 2 is AAC-LC
  };
}

// ------------------------------------------------------------------------------ the framer
class HeaderFrames {
  constructor(format, header, codec, primingSamples) {
    this.format = format;
    this.header = header;
    this.codec = codec; // header -> the codec string
    this.primingSamples = primingSamples;
    this.cutter = new UnitCutter((b, at) => {
      const found = header(b, at);
      return found && found.length;
    });
    this.config = null;
    this.lengthSamples = null;
  }

  push(bytes) {
    return this.cutter.push(bytes).map((frame) => {
      const { samples, rateHz, channels, ...rest } = this.header(frame, 0);
      if (!this.config) {
        this.config = { codec: this.codec(rest), sampleRate: rateHz, numberOfChannels: channels };
      } else if (rateHz !== this.config.sampleRate || channels !== this.config.numberOfChannels) {
        throw new Error(`the ${this.format} stream changed its sample rate or channels mid-stream`);
      }
      return { data: frame, samples };
    });
  }
}

export const mp3Frames = () => new HeaderFrames("mp3", mp3Header, () => "mp3", LAME_DELAY_SAMPLES);
export const adtsFrames = () => new HeaderFrames("aac", adtsHeader, (header) => `mp4a.40.${header.objectType}`,
  AAC_PRIMING_SAMPLES);
