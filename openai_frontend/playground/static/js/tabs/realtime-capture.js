// AudioWorklet of the Realtime tab: the microphone's samples (at the AudioContext's rate, which
// the tab sets to the session's input rate, 24 kHz) as PCM16 little-endian, posted to the page
// in blocks of `blockFrames` (100 ms at 24 kHz) as transferable ArrayBuffers.
class Pcm16Capture extends AudioWorkletProcessor {
  constructor(options) {
    super();
    this.blockFrames = (options.processorOptions && options.processorOptions.blockFrames) || 2400;
    this.block = new Int16Array(this.blockFrames);
    this.filled = 0;
  }

  process(inputs) {
    const input = inputs[0];
    if (input && input.length) {
      const samples = input[0];
      for (let i = 0; i < samples.length; i++) {
        const s = Math.max(-1, Math.min(1, samples[i]));
        this.block[this.filled++] = s < 0 ? s * 32768 : s * 32767;
        if (this.filled === this.blockFrames) {
          this.port.postMessage(this.block.buffer, [this.block.buffer]);
          this.block = new Int16Array(this.blockFrames);
          this.filled = 0;
        }
      }
    }
    return true;
  }
}

registerProcessor("pcm16-capture", Pcm16Capture);
