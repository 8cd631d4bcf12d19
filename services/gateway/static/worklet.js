// AudioWorklet processors of the voice-agent page: microphone capture and agent playback.
// Both run at the AudioContext's rate (the page asks for 24 kHz, the rate it declares to
// the gateway both ways), so no resampling happens here.

const FRAME_MS = 20;

// Microphone → PCM16 frames of 20 ms, posted (transferred) to the page.
class Capture extends AudioWorkletProcessor {
  constructor() {
    super();
    this.size = Math.round((sampleRate * FRAME_MS) / 1000);
    this.frame = new Int16Array(this.size);
    this.filled = 0;
  }

  process(inputs) {
    const channel = inputs[0] && inputs[0][0];
    if (!channel) return true;
    for (let i = 0; i < channel.length; i++) {
      const s = Math.max(-1, Math.min(1, channel[i]));
      this.frame[this.filled++] = s < 0 ? s * 0x8000 : s * 0x7fff;
      if (this.filled === this.size) {
        this.port.postMessage(this.frame.buffer, [this.frame.buffer]);
        this.frame = new Int16Array(this.size);
        this.filled = 0;
      }
    }
    return true;
  }
}

// Agent audio: a queue of PCM16 chunks played with a jitter buffer. Playing starts (and,
// after an underrun, starts again) once `prebuffer` samples are queued: at least jitterMs,
// and one and a half of the largest chunk seen, since audio arrives a chunk at a time
// (the cascade sends 40 ms frames, a full-duplex model 80 ms ones: a buffer shorter than a
// frame runs dry whenever one comes late). Each underrun adds UNDERRUN_STEP_MS, up to
// MAX_PREBUFFER_MS. `clear` drops everything at once (the next 128-sample quantum is
// silence): barge-in.
const UNDERRUN_STEP_MS = 20;
const MAX_PREBUFFER_MS = 300;

class Player extends AudioWorkletProcessor {
  constructor(options) {
    super();
    const opts = (options && options.processorOptions) || {};
    this.baseMs = opts.jitterMs || 60;
    this.largestChunk = 0; // samples
    this.extraMs = 0; // grown by underruns
    this.setPrebuffer();
    this.chunks = [];
    this.offset = 0; // read position in chunks[0]
    this.queued = 0;
    this.playing = false;
    this.draining = false; // the response's audio is complete: play out what is left
    this.played = 0;
    this.underruns = 0;
    this.quanta = 0;
    this.port.onmessage = (event) => this.onMessage(event.data);
  }

  setPrebuffer() {
    const chunkMs = (1000 * this.largestChunk) / sampleRate;
    this.prebufferMs = Math.min(MAX_PREBUFFER_MS, Math.max(this.baseMs, 1.5 * chunkMs) + this.extraMs);
    this.prebuffer = Math.round((sampleRate * this.prebufferMs) / 1000);
  }

  onMessage(message) {
    if (message.type === "audio") {
      const pcm = new Int16Array(message.pcm);
      const samples = new Float32Array(pcm.length);
      for (let i = 0; i < pcm.length; i++) samples[i] = pcm[i] / 0x8000;
      if (samples.length > this.largestChunk) {
        this.largestChunk = samples.length;
        this.setPrebuffer();
      }
      this.chunks.push(samples);
      this.queued += samples.length;
      this.draining = false;
    } else if (message.type === "end") {
      this.draining = true;
    } else if (message.type === "clear") {
      const dropped = this.queued;
      this.chunks = [];
      this.offset = 0;
      this.queued = 0;
      this.playing = false;
      this.draining = false;
      this.port.postMessage({ type: "cleared", dropped, played: this.played });
    }
  }

  process(_inputs, outputs) {
    const out = outputs[0][0];
    if (!this.playing && this.queued > 0 && (this.queued >= this.prebuffer || this.draining)) {
      this.playing = true;
      this.port.postMessage({ type: "playing", played: this.played });
    }
    let written = 0;
    while (this.playing && written < out.length && this.chunks.length) {
      const chunk = this.chunks[0];
      const n = Math.min(out.length - written, chunk.length - this.offset);
      out.set(chunk.subarray(this.offset, this.offset + n), written);
      written += n;
      this.offset += n;
      if (this.offset === chunk.length) {
        this.chunks.shift();
        this.offset = 0;
      }
    }
    this.played += written;
    this.queued -= written;
    if (this.playing && this.queued === 0) {
      this.playing = false;
      if (!this.draining) {
        this.underruns++;
        this.extraMs = Math.min(MAX_PREBUFFER_MS, this.extraMs + UNDERRUN_STEP_MS);
        this.setPrebuffer();
      }
      this.port.postMessage({ type: "idle", played: this.played });
    }
    if (++this.quanta % 8 === 0) {
      this.port.postMessage({
        type: "stats", played: this.played, queued: this.queued, underruns: this.underruns,
        prebufferMs: this.prebufferMs,
      });
    }
    return true;
  }
}

registerProcessor("va-capture", Capture);
registerProcessor("va-player", Player);
