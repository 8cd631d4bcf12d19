// The voice-agent browser client: microphone → /v1/stream → agent voice, no build step.
// Protocol: docs/protocol.md. Counters and timings are exposed on window.voiceAgent for
// tests and for anyone curious (open the console).

const RATES = [8000, 16000, 24000, 48000];
const WANTED_RATE = 24000; // one rate both ways: the gateway's output rate, no resampling
const JITTER_MS = 60;

const CLOSE_MESSAGES = {
  1000: "Session ended.",
  1001: "The gateway is shutting down.",
  1006: "Connection lost: the gateway is unreachable or dropped the connection.",
  1008: "Refused by policy: check the token (when auth is on) or this page's origin.",
  1009: "A message was too big for the gateway.",
  1011: "The gateway hit an internal error (see its log).",
  1012: "The gateway is restarting: reconnecting to the same session…",
  1013: "The gateway is at capacity: try again in a moment.",
};

const ERROR_MESSAGES = {
  invalid_message: "The gateway refused a message from this page",
  invalid_audio: "The gateway refused the microphone audio",
  unsupported_sample_rate: "This browser's audio sample rate is not supported",
  capacity: "The gateway is at capacity",
  asr_unavailable: "Speech recognition is unavailable (is the ASR service running?)",
  tts_unavailable: "Speech synthesis is unavailable (is the TTS service running?)",
  agent_failed: "The agent failed to answer",
  rate_limited: "Too many requests: slow down",
  unauthorized: "Authentication failed: check the token",
  internal: "The gateway hit an internal error",
};

const $ = (id) => document.getElementById(id);

const va = {
  state: "idle",
  sessionId: null,
  counters: {
    sentFrames: 0, sentSamples: 0, receivedSamples: 0, playedSamples: 0, queuedSamples: 0,
    clears: 0, clearedSamples: 0, underruns: 0, turns: 0,
  },
  transcripts: [], // final user transcripts
  responses: {}, // response_id → {text, status, heard, utterance_id, ...timings}
  latencies: [], // per answered turn: {response_id, v2v_ms, v2v_played_ms}
  errors: [], // {code, message, fatal}
  closes: [], // {code, reason, message}
  pageToFirstAudioMs: null,
  lastClear: null,
  userSpeaking: false, // between speech.started and speech.stopped
  clearLog: [], // each output_audio.clear: {response_id, during_speech}
  sampleRate: null,
  agent: null, // the session's agent, as the gateway last said
  agents: null, // GET /v1/agents: {agents, default, notice}
  connect: () => connect(),
  disconnect: () => disconnect(),
  say: (text) => send({ type: "response.create", text }),
  type: (text) => send({ type: "conversation.text", text }),
};
window.voiceAgent = va;

let ws = null;
let ctx = null;
let mic = null;
let player = null;
let streamSamples = 0; // samples sent on this socket (the gateway's clock of the stream)
let sentLog = []; // [last sample index of a frame, performance.now() when it was sent]
let speechEnds = {}; // utterance_id → when the frame holding its end was sent
let current = null; // the response being received
let resumeOnce = false;

function setStatus(text, kind = "idle") {
  const status = $("status");
  status.textContent = text;
  status.className = `status ${kind}`;
}

function logLine(kind, who, text) {
  const li = document.createElement("li");
  li.className = kind;
  if (who) {
    const b = document.createElement("span");
    b.className = "who";
    b.textContent = who;
    li.append(b);
  }
  const t = document.createElement("span");
  t.textContent = text;
  li.append(t);
  $("log").append(li);
  li.scrollIntoView({ block: "nearest" });
  return t;
}

function send(message) {
  if (ws && ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify(message));
}

function median(values) {
  if (!values.length) return null;
  const s = [...values].sort((a, b) => a - b);
  const m = Math.floor(s.length / 2);
  return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;
}

function showMeters() {
  const v2v = va.latencies.map((l) => l.v2v_ms).filter((v) => v != null);
  $("v2v-last").textContent = v2v.length ? `${Math.round(v2v[v2v.length - 1])} ms` : "–";
  $("v2v-p50").textContent = v2v.length ? `${Math.round(median(v2v))} ms` : "–";
  $("turns").textContent = String(va.counters.turns);
  const seconds = va.sampleRate ? va.counters.playedSamples / va.sampleRate : 0;
  $("played").textContent = `${seconds.toFixed(1)} s`;
}

async function loadVoices() {
  const select = $("voice");
  try {
    const token = $("token").value.trim();
    const headers = token ? { Authorization: `Bearer ${token}` } : {};
    const response = await fetch("/v1/voices", { headers });
    if (!response.ok) throw new Error(`HTTP ${response.status}`);
    const listed = await response.json();
    for (const voice of listed.voices || []) {
      if (voice.id === "default") continue;
      const option = document.createElement("option");
      option.value = voice.id;
      option.textContent = voice.name ? `${voice.name} (${voice.id})` : voice.id;
      select.append(option);
    }
  } catch (err) {
    logLine("note", null, `Voice list unavailable (${err.message}): the default voice is used.`);
  }
}

async function loadAgents() {
  const select = $("agent");
  try {
    const token = $("token").value.trim();
    const headers = token ? { Authorization: `Bearer ${token}` } : {};
    const response = await fetch("/v1/agents", { headers });
    if (!response.ok) throw new Error(`HTTP ${response.status}`);
    const listed = await response.json();
    for (const agent of listed.agents || []) {
      const option = document.createElement("option");
      option.value = agent.id;
      option.textContent = agent.id === listed.default ? `${agent.id} (default)` : agent.id;
      select.append(option);
    }
    select.value = listed.default;
    va.agents = listed;
    if (listed.notice) logLine("note", null, `Agent: ${listed.notice}.`);
  } catch (err) {
    logLine("note", null, `Agent list unavailable (${err.message}): the gateway's default answers.`);
  }
}

function sessionChoices() {
  const choices = { voice: $("voice").value };
  if ($("agent").value) choices.agent = $("agent").value;
  return choices;
}

// ------------------------------------------------------------------ audio

async function micSource(stream) {
  // 24 kHz when the browser resamples the microphone for us (Chrome, Safari); otherwise
  // (Firefox refuses a context rate unlike the device's) the device's own rate.
  ctx = new AudioContext({ sampleRate: WANTED_RATE, latencyHint: "interactive" });
  try {
    return ctx.createMediaStreamSource(stream);
  } catch (err) {
    await ctx.close();
    ctx = new AudioContext({ latencyHint: "interactive" });
    return ctx.createMediaStreamSource(stream);
  }
}

async function startAudio() {
  const stream = await navigator.mediaDevices.getUserMedia({
    audio: { echoCancellation: true, noiseSuppression: true, autoGainControl: true, channelCount: 1 },
  });
  mic = { stream };
  const source = await micSource(stream);
  if (!RATES.includes(ctx.sampleRate)) {
    throw new Error(`this browser runs audio at ${ctx.sampleRate} Hz; the gateway takes ${RATES.join(", ")}`);
  }
  va.sampleRate = ctx.sampleRate;
  await ctx.audioWorklet.addModule("/static/worklet.js");
  const capture = new AudioWorkletNode(ctx, "va-capture", { numberOfInputs: 1, numberOfOutputs: 1 });
  capture.port.onmessage = (event) => onMicFrame(event.data);
  source.connect(capture);
  capture.connect(ctx.destination); // it writes nothing: silence, but it keeps the node pulled
  player = new AudioWorkletNode(ctx, "va-player", {
    numberOfInputs: 0, outputChannelCount: [1], processorOptions: { jitterMs: JITTER_MS },
  });
  player.port.onmessage = (event) => onPlayer(event.data);
  player.connect(ctx.destination);
  mic = { stream, source, capture };
  await ctx.resume();
}

function stopAudio() {
  if (mic) mic.stream.getTracks().forEach((track) => track.stop());
  if (ctx && ctx.state !== "closed") ctx.close();
  mic = ctx = player = null;
}

function onMicFrame(buffer) {
  if (!ws || ws.readyState !== WebSocket.OPEN || va.state !== "live") return;
  ws.send(buffer);
  const c = va.counters;
  c.sentFrames++;
  c.sentSamples += buffer.byteLength / 2;
  streamSamples += buffer.byteLength / 2;
  sentLog.push([streamSamples, performance.now()]);
  if (sentLog.length > 3000) sentLog = sentLog.slice(-1500); // the last 30 s or more
}

function sentAtMs(audioMs) {
  const sample = (audioMs * va.sampleRate) / 1000;
  const hit = sentLog.find(([end]) => end >= sample);
  return hit ? hit[1] : performance.now();
}

function onPlayer(message) {
  const c = va.counters;
  if (message.played != null) c.playedSamples = message.played;
  if (message.type === "stats") {
    c.queuedSamples = message.queued;
    c.underruns = message.underruns;
  } else if (message.type === "playing") {
    const now = performance.now();
    if (va.pageToFirstAudioMs == null) va.pageToFirstAudioMs = now;
    if (current && current.playedAt == null) {
      current.playedAt = now;
      if (current.speechEndAt != null) current.timing.v2v_played_ms = now - current.speechEndAt;
    }
  } else if (message.type === "cleared") {
    c.clearedSamples += message.dropped;
    c.queuedSamples = 0;
    va.lastClear = { at: performance.now(), dropped: message.dropped, played: message.played };
  }
  showMeters();
}

// ------------------------------------------------------------------ session

function onAudioFrame(buffer) {
  va.counters.receivedSamples += buffer.byteLength / 2;
  if (current && current.firstFrameAt == null) {
    current.firstFrameAt = performance.now();
    if (current.speechEndAt != null) {
      current.timing.v2v_ms = current.firstFrameAt - current.speechEndAt;
      current.timing.after_turn_end_ms = current.firstFrameAt - current.stoppedAt;
      va.latencies.push(current.timing);
    }
  }
  if (player) player.port.postMessage({ type: "audio", pcm: buffer }, [buffer]);
}

const handlers = {
  "session.created": (e) => {
    va.sessionId = e.session.id;
    const rate = va.sampleRate;
    va.agent = e.session.agent;
    send({ type: "session.update", session: { input_sample_rate: rate, output_sample_rate: rate, ...sessionChoices(), partials: true } });
  },
  "session.updated": (e) => {
    va.agent = e.session.agent;
    if (va.state !== "live") {
      va.state = "live";
      setStatus(`Connected (session ${e.session.id}): speak now.`, "live");
    }
  },
  "speech.started": () => { va.userSpeaking = true; $("partial").textContent = "…"; },
  "transcript.partial": (e) => { $("partial").textContent = e.text; },
  "speech.stopped": (e) => {
    va.userSpeaking = false;
    speechEnds[e.utterance_id] = { sentAt: sentAtMs(e.audio_end_ms), stoppedAt: performance.now() };
  },
  "transcript.final": (e) => {
    $("partial").textContent = "";
    if (e.text.trim()) {
      va.transcripts.push(e.text);
      va.counters.turns++;
      logLine("user", "You", e.text);
    }
  },
  "response.created": (e) => {
    const end = e.utterance_id ? speechEnds[e.utterance_id] : undefined;
    current = {
      id: e.response_id, utterance_id: e.utterance_id || null, text: "", status: "in_progress",
      speechEndAt: end ? end.sentAt : null, stoppedAt: end ? end.stoppedAt : null,
      firstFrameAt: null, playedAt: null,
      // v2v_ms: the frame holding the end of speech sent → first agent audio received;
      // after_turn_end_ms: speech.stopped received → first agent audio received
      timing: { response_id: e.response_id, v2v_ms: null, v2v_played_ms: null, after_turn_end_ms: null },
      line: logLine("agent", "Agent", ""),
    };
    va.responses[e.response_id] = current;
  },
  "response.function_call": (e) => {
    logLine("note", null, `The agent called ${e.name}(${e.arguments}); this page runs no tools.`);
  },
  "response.text.delta": (e) => {
    const r = va.responses[e.response_id];
    if (r) { r.text += e.delta; r.line.textContent = r.text; }
  },
  "response.audio.done": () => { if (player) player.port.postMessage({ type: "end" }); },
  "output_audio.clear": (e) => {
    if (player) player.port.postMessage({ type: "clear" });
    va.counters.clears++;
    va.clearLog.push({ response_id: e.response_id, during_speech: va.userSpeaking });
    const r = va.responses[e.response_id];
    if (r) r.line.parentElement.classList.add("cut");
  },
  "response.done": (e) => {
    const r = va.responses[e.response_id];
    if (!r) return;
    r.status = e.status;
    r.heard = e.text;
    if (e.status === "cancelled") {
      r.line.parentElement.classList.add("cut");
      r.line.textContent = `${r.text}  — interrupted; you heard: “${e.text}”`;
    }
    if (current === r) current = null;
  },
  error: (e) => {
    va.errors.push({ code: e.code, message: e.message, fatal: e.fatal });
    const what = ERROR_MESSAGES[e.code] || "Error";
    logLine("note", null, `${what}: ${e.message}`);
    if (e.fatal) setStatus(`${what}: ${e.message}`, "error");
  },
};

function onMessage(event) {
  if (typeof event.data !== "string") return onAudioFrame(event.data);
  let message;
  try { message = JSON.parse(event.data); } catch { return; }
  const handle = handlers[message.type];
  if (handle) handle(message);
  showMeters();
}

function onClose(event) {
  const message = CLOSE_MESSAGES[event.code] || `Connection closed (code ${event.code}).`;
  const detail = event.reason ? ` ${event.reason}` : "";
  va.closes.push({ code: event.code, reason: event.reason, message });
  const resume = event.code === 1012 && va.sessionId && !resumeOnce;
  ws = null;
  va.state = "idle";
  setStatus(message + detail, event.code === 1000 ? "idle" : "error");
  logLine("note", null, `${message}${detail}`);
  if (resume) {
    resumeOnce = true;
    openSocket(va.sessionId);
    return;
  }
  stopAudio();
  $("connect").disabled = false;
  $("disconnect").disabled = true;
}

function openSocket(sessionId) {
  const scheme = location.protocol === "https:" ? "wss" : "ws";
  const query = sessionId ? `?session_id=${encodeURIComponent(sessionId)}` : "";
  const token = $("token").value.trim();
  // browsers cannot send an Authorization header on a WebSocket: the token rides in a
  // subprotocol (never in the URL, which ends up in logs)
  const protocols = token ? ["voice-agent.v1", `voice-agent.token.${token}`] : [];
  va.state = "connecting";
  streamSamples = 0;
  sentLog = [];
  speechEnds = {};
  ws = new WebSocket(`${scheme}://${location.host}/v1/stream${query}`, protocols);
  ws.binaryType = "arraybuffer";
  ws.onmessage = onMessage;
  ws.onclose = onClose;
}

async function connect() {
  if (ws) return;
  $("connect").disabled = true;
  setStatus("Starting the microphone…");
  try {
    await startAudio();
  } catch (err) {
    const hint = window.isSecureContext ? "" : " (microphones need https or localhost)";
    setStatus(`Microphone unavailable: ${err.message}${hint}`, "error");
    va.errors.push({ code: "microphone", message: err.message, fatal: true });
    stopAudio();
    $("connect").disabled = false;
    return;
  }
  setStatus("Connecting…");
  resumeOnce = false;
  try {
    openSocket(null);
  } catch (err) {
    setStatus(`Cannot connect: ${err.message}`, "error");
    stopAudio();
    $("connect").disabled = false;
    return;
  }
  $("disconnect").disabled = false;
}

function disconnect() {
  if (!ws) return;
  send({ type: "session.close" });
  ws.close(1000);
}

function main() {
  const hash = new URLSearchParams(location.hash.slice(1));
  if (hash.get("token")) {
    $("token").value = hash.get("token");
    history.replaceState(null, "", location.pathname + location.search);
  }
  $("controls").addEventListener("submit", (event) => { event.preventDefault(); connect(); });
  $("disconnect").addEventListener("click", disconnect);
  $("voice").addEventListener("change", () => send({ type: "session.update", session: { voice: $("voice").value } }));
  $("agent").addEventListener("change", () => send({ type: "session.update", session: { agent: $("agent").value } }));
  loadVoices();
  loadAgents();
}

main();
