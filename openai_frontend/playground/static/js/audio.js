// Playing audio while it streams: PCM chunks scheduled back to back on one AudioContext.
//
// Used by the Speech, Chat, Voices and Realtime tabs. The figures a tab shows come from here:
// `firstSoundMs` (performance.now() at which the first chunk starts to sound: TTFP when the
// request started at t=0) and `playedSeconds` (audio time actually played, advancing while the
// stream is still arriving: the e2e tests read it through the element's data-audio-time).

/**
 * A streaming PCM player.
 *   new PcmPlayer({ sampleRate: 22050, channels: 1 })
 *   player.pushPcm16(uint8Array)   // little-endian signed 16-bit, interleaved; any byte split
 *   player.pushFloat32([ch0, ch1]) // one Float32Array per channel, samples in [-1, 1]
 *   player.stop()                  // barge-in: silence now, drop what is queued
 * sampleRate: Hz of the stream (the AudioContext runs at it: no resampling here; Chromium takes
 * 3000-768000 Hz). Call `start()` from a user gesture (click) so that the browser lets it sound.
 */
export class PcmPlayer {
  constructor({ sampleRate, channels = 1, leadSeconds = 0.05 } = {}) {
    if (!(sampleRate > 0)) throw new Error(`bad sample rate ${sampleRate}`);
    this.sampleRate = sampleRate;
    this.channels = channels;
    this.leadSeconds = leadSeconds;
    this.ctx = null;
    this.sources = [];
    this.intervals = []; // [start, end] in ctx time of each scheduled chunk
    this.nextTime = 0;
    this.carry = null; // the partial frame (Uint8Array) at the end of the previous pushPcm16
    this.firstSoundMs = null; // performance.now() when the first chunk starts sounding
    this.scheduledSeconds = 0;
    this.playedBefore = 0; // seconds played before the last stop()
  }

  /** Create (or resume) the AudioContext. */
  async start() {
    if (!this.ctx) this.ctx = new AudioContext({ sampleRate: this.sampleRate, latencyHint: "interactive" });
    if (this.ctx.state === "suspended") await this.ctx.resume();
    return this;
  }

  /** Queue little-endian 16-bit PCM bytes (interleaved channels). */
  pushPcm16(bytes) {
    let data = bytes;
    if (this.carry !== null) {
      data = new Uint8Array(this.carry.length + bytes.length);
      data.set(this.carry, 0);
      data.set(bytes, this.carry.length);
      this.carry = null;
    }
    const frameBytes = 2 * this.channels;
    const usable = data.length - (data.length % frameBytes);
    if (usable < data.length) this.carry = data.slice(usable); // a frame split across chunks
    if (!usable) return;
    const view = new DataView(data.buffer, data.byteOffset, usable);
    const frames = usable / frameBytes;
    const out = Array.from({ length: this.channels }, () => new Float32Array(frames));
    for (let i = 0; i < frames; i++) {
      for (let c = 0; c < this.channels; c++) out[c][i] = view.getInt16((i * this.channels + c) * 2, true) / 32768;
    }
    this.pushFloat32(out);
  }

  /** Queue one Float32Array per channel (equal lengths). */
  pushFloat32(channelData) {
    if (!this.ctx) throw new Error("PcmPlayer.start() first");
    const frames = channelData[0].length;
    if (!frames) return;
    const buffer = this.ctx.createBuffer(this.channels, frames, this.sampleRate);
    channelData.forEach((data, c) => buffer.copyToChannel(data, c));
    const source = this.ctx.createBufferSource();
    source.buffer = buffer;
    source.connect(this.ctx.destination);
    const now = this.ctx.currentTime;
    const at = Math.max(this.nextTime, now + this.leadSeconds);
    source.start(at);
    if (this.firstSoundMs === null) this.firstSoundMs = performance.now() + (at - now) * 1000;
    this.nextTime = at + buffer.duration;
    this.intervals.push([at, this.nextTime]);
    this.scheduledSeconds += buffer.duration;
    this.sources.push(source);
    source.onended = () => {
      const i = this.sources.indexOf(source);
      if (i >= 0) this.sources.splice(i, 1);
    };
  }

  /** Seconds of audio played so far (advances as the context plays; stops at what was queued). */
  get playedSeconds() {
    if (!this.ctx) return this.playedBefore;
    const now = this.ctx.currentTime;
    let played = 0;
    for (const [a, b] of this.intervals) if (now > a) played += Math.min(now, b) - a;
    return this.playedBefore + played;
  }

  /** Seconds queued and not yet played. */
  get bufferedSeconds() {
    return this.ctx ? Math.max(0, this.nextTime - this.ctx.currentTime) : 0;
  }

  /** Silence now and drop the queue (barge-in); the player can be pushed to again. */
  stop() {
    this.playedBefore = this.playedSeconds;
    for (const s of this.sources) {
      try {
        s.stop();
      } catch (_) {
        /* not started */
      }
    }
    this.sources = [];
    this.intervals = [];
    this.nextTime = 0;
    this.carry = null;
  }

  /** stop() and release the AudioContext. */
  async close() {
    this.stop();
    if (this.ctx) await this.ctx.close();
    this.ctx = null;
  }
}

/**
 * The format of a WAV stream's header (RIFF/WAVE, PCM): {sampleRate, channels, bitsPerSample,
 * dataOffset} once `bytes` (the stream's first bytes) holds the "data" chunk's header, else null
 * (read more). A streamed WAV's sizes are placeholders, so only the offsets are used.
 */
export function wavFormat(bytes) {
  if (bytes.length < 12) return null;
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.length);
  const tag = (o) => String.fromCharCode(bytes[o], bytes[o + 1], bytes[o + 2], bytes[o + 3]);
  if (tag(0) !== "RIFF" || tag(8) !== "WAVE") throw new Error("not a WAV stream");
  let offset = 12;
  let fmt = null;
  while (offset + 8 <= bytes.length) {
    const id = tag(offset);
    const size = view.getUint32(offset + 4, true);
    if (id === "fmt ") {
      if (offset + 8 + 16 > bytes.length) return null;
      fmt = {
        channels: view.getUint16(offset + 10, true),
        sampleRate: view.getUint32(offset + 12, true),
        bitsPerSample: view.getUint16(offset + 22, true),
      };
    } else if (id === "data") {
      if (!fmt) throw new Error("WAV data before its format");
      return { ...fmt, dataOffset: offset + 8 };
    }
    offset += 8 + size + (size % 2);
  }
  return null;
}

/**
 * Mark `node` with the player's figures for tests and people: data-audio-time (seconds played),
 * data-first-sound-ms, refreshed every `everyMs` until the returned stop function is called.
 */
export function exposePlayback(node, player, everyMs = 100) {
  const tick = () => {
    node.dataset.audioTime = player.playedSeconds.toFixed(3);
    if (player.firstSoundMs !== null) node.dataset.firstSoundMs = player.firstSoundMs.toFixed(1);
  };
  tick();
  const id = setInterval(tick, everyMs);
  return () => {
    clearInterval(id);
    tick();
  };
}
