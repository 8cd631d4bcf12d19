// The voice-agent browser client: microphone → /v1/stream → agent voice, no build step.
// Protocol: docs/protocol.md. Counters and timings are exposed on window.voiceAgent for
// tests and for anyone curious (open the console).

const RATES = [8000, 16000, 24000, 48000];
const WANTED_RATE = 24000; // one rate both ways: the gateway's output rate, no resampling
const JITTER_MS = 60; // the player's smallest prebuffer; it grows to the frames it gets

// A session outlives its connection: the gateway keeps it for its resume window
// (VA_GATEWAY__RESUME_WINDOW_S, 300 s by default; docs/protocol.md "Reconnect"), and
// /v1/stream?session_id=ID within it takes it up again, history and all. The page retries
// with backoff, well inside that window, then gives up and says so.
const DEFAULTS = {
  retryBaseMs: 500, // first wait before a reconnect; doubled each attempt...
  retryMaxMs: 8000, // ...up to this
  retryForMs: 120000, // give up when the first failed attempt is this old
  connectTimeoutMs: 10000, // a socket not open by then is a failed attempt (and a probe, unanswered)
  maxUnsentMs: 1000, // microphone audio the socket may hold unsent before it counts as stalled
};

const CLOSE_MESSAGES = {
  1000: "Session ended.",
  1001: "The gateway is going away.",
  1006: "Connection lost.",
  1008: "The gateway ended the session (policy).",
  1009: "A message was too big for the gateway.",
  1011: "The gateway hit an internal error (see its log).",
  1012: "The gateway is restarting.",
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
  rate_limited: "Too many requests or sessions for this tenant: slow down",
  quota_exceeded: "The tenant's daily audio quota is used up",
  unauthorized: "The token was refused",
  forbidden: "Not allowed (this page's origin, or a session of another tenant)",
  not_supported: "The agent's backend does not take this request",
  duplex_unavailable: "The full-duplex model service is unavailable",
  internal: "The gateway hit an internal error",
};

const $ = (id) => document.getElementById(id);

const va = {
  state: "idle", // idle | connecting | live | reconnecting
  sessionId: null,
  session: null, // the session as the gateway last described it
  counters: {
    sentFrames: 0, sentSamples: 0, receivedSamples: 0, playedSamples: 0, queuedSamples: 0,
    clears: 0, clearedSamples: 0, underruns: 0, turns: 0, unsentFrames: 0, prebufferMs: JITTER_MS,
  },
  transcripts: [], // final user transcripts
  responses: {}, // response_id → {text, status, heard, utterance_id, ...timings}
  latencies: [], // per answered turn: {response_id, v2v_ms, v2v_played_ms}
  errors: [], // {code, message, fatal}
  closes: [], // {code, reason, message}
  refusals: [], // why a socket closed before it opened, as the REST API told: {status, code, message}
  resumes: 0, // sessions taken up again after a lost connection
  stalls: 0, // sockets given up because the network stopped taking the audio
  pageToFirstAudioMs: null,
  lastClear: null,
  userSpeaking: false, // between speech.started and speech.stopped
  clearLog: [], // each output_audio.clear: {response_id, during_speech}
  sampleRate: null,
  agent: null, // the session's agent, as the gateway last said
  agents: null, // GET /v1/agents: {agents, default, notice}
  config: { ...DEFAULTS },
  connect: () => connect(),
  disconnect: () => disconnect(),
  say: (text) => send({ type: "response.create", text }),
  type: (text) => send({ type: "conversation.text", text }),
};
window.voiceAgent = va;

let ws = null;
let sock = null; // the current socket's own state: {ws, opened, fatal, resuming, leaving, timer}
let ctx = null;
let mic = null;
let player = null;
let streamSamples = 0; // samples sent on this socket (the gateway's clock of the stream)
let sentLog = []; // [last sample index of a frame, performance.now() when it was sent]
let speechEnds = {}; // utterance_id → when the frame holding its end was sent
let current = null; // the response being received
let resumeId = null; // the session a (re)connect asks for; null: a new one
let retry = { attempt: 0, since: null, timer: null };
let pending = {}; // voice/agent the user picked that no gateway has been told yet
let listsToken = null; // the token the voice and agent lists were asked with
let listsRound = 0;

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

function token() {
  return $("token").value.trim();
}

function authHeaders() {
  const t = token();
  return t ? { Authorization: `Bearer ${t}` } : {};
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

// ------------------------------------------------------------------ pickers

function option(value, text) {
  const o = document.createElement("option");
  o.value = value;
  o.textContent = text;
  return o;
}

function showChoice(field, value) {
  // the picker shows `value`, listed or not (a token may name a voice the list lacks)
  if (value == null) return;
  const select = $(field);
  if (![...select.options].some((o) => o.value === value)) select.append(option(value, value));
  select.value = value;
}

function shownChoice(field, listedDefault) {
  if (pending[field] != null) return pending[field];
  if (va.session) return va.session[field];
  return listedDefault;
}

async function loadVoices(round) {
  try {
    const response = await fetch("/v1/voices", { headers: authHeaders() });
    if (!response.ok) throw new Error(`HTTP ${response.status}`);
    const listed = await response.json();
    if (round !== listsRound) return;
    const options = [option("default", "default")];
    for (const voice of listed.voices || []) {
      if (voice.id === "default") continue;
      options.push(option(voice.id, voice.name ? `${voice.name} (${voice.id})` : voice.id));
    }
    $("voice").replaceChildren(...options);
    showChoice("voice", shownChoice("voice", "default"));
  } catch (err) {
    if (round === listsRound) {
      logLine("note", null, `Voice list unavailable (${err.message}): the default voice is used.`);
    }
  }
}

async function loadAgents(round) {
  try {
    const response = await fetch("/v1/agents", { headers: authHeaders() });
    if (!response.ok) throw new Error(`HTTP ${response.status}`);
    const listed = await response.json();
    if (round !== listsRound) return;
    const options = (listed.agents || []).map((agent) =>
      option(agent.id, agent.id === listed.default ? `${agent.id} (default)` : agent.id));
    $("agent").replaceChildren(...options);
    showChoice("agent", shownChoice("agent", listed.default));
    va.agents = listed;
    if (listed.notice) logLine("note", null, `Agent: ${listed.notice}.`);
  } catch (err) {
    if (round === listsRound) {
      logLine("note", null, `Agent list unavailable (${err.message}): the gateway's default answers.`);
    }
  }
}

function loadLists() {
  // the lists are the tenant's: asked again whenever the token changes
  listsToken = token();
  const round = ++listsRound;
  return Promise.all([loadVoices(round), loadAgents(round)]);
}

function pick(field, value) {
  // only what the user picks is sent: a session keeps the settings its token was minted with
  if (ws && ws.readyState === WebSocket.OPEN) send({ type: "session.update", session: { [field]: value } });
  else pending[field] = value;
}

function syncPickers(session) {
  showChoice("voice", pending.voice ?? session.voice);
  showChoice("agent", pending.agent ?? session.agent);
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
  const c = va.counters;
  if (!ws || ws.readyState !== WebSocket.OPEN || va.state !== "live") {
    if (va.state === "reconnecting") c.unsentFrames++;
    return;
  }
  // A network that went dead without a word (Wi-Fi gone, a NAT forgot us) shows here
  // first: the socket holds what it cannot send. Past `maxUnsentMs` of audio, queueing
  // more only grows memory and delay: drop this socket and take the session up again.
  const maxBytes = (2 * va.sampleRate * va.config.maxUnsentMs) / 1000;
  if (ws.bufferedAmount + buffer.byteLength > maxBytes) {
    c.unsentFrames++;
    stalled();
    return;
  }
  ws.send(buffer);
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
    c.prebufferMs = message.prebufferMs;
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
    const s = e.session;
    const asked = sock && sock.resuming;
    if (asked && s.id !== asked) {
      logLine("note", null, `Session ${asked} could not be resumed (its resume window passed): ` +
        `this is a new session, without its history.`);
    } else if (s.resumed) {
      logLine("note", null, `Resumed session ${s.id}.`);
    }
    resumeId = s.id;
    va.sessionId = s.id;
    va.session = s;
    va.agent = s.agent;
    syncPickers(s);
    // the rates this page's audio runs at, and only what the user picked: the voice and
    // agent a token was minted with (or a resumed session has) stay as they are
    const rate = va.sampleRate;
    const update = { input_sample_rate: rate, output_sample_rate: rate, partials: true, ...pending };
    pending = {};
    send({ type: "session.update", session: update });
  },
  "session.updated": (e) => {
    va.session = e.session;
    va.agent = e.session.agent;
    syncPickers(e.session);
    if (va.state !== "live") {
      const again = retry.since != null || e.session.resumed;
      va.state = "live";
      retry = { attempt: 0, since: null, timer: null }; // a live session earns a fresh budget
      if (again) va.resumes++;
      const what = again ? "Reconnected to" : "Connected";
      setStatus(`${what} (session ${e.session.id}): speak now.`, "live");
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
    if (e.fatal) {
      if (sock) sock.fatal = e; // the close that follows is explained by it
      setStatus(`${what}: ${e.message}`, "error");
    }
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

// ------------------------------------------------------------------ connection

function lostConnection(code, reason) {
  // the network, not the gateway: a drop, or the gateway's pings went unanswered
  return code === 1006 || (code === 1011 && /keepalive/i.test(reason));
}

function resumable(s, code, reason) {
  if (lostConnection(code, reason) || [1001, 1011, 1012].includes(code)) return true;
  // at capacity (the draining gateway itself, which the reconnect after its 1012 may reach
  // again, or a full one): try again when the gateway's error says when
  return code === 1013 && (retry.since != null || retryHintMs(s) > 0);
}

function closeMessage(s, code, reason) {
  if (s.fatal && s.fatal.code !== "capacity") {
    return `${ERROR_MESSAGES[s.fatal.code] || "Error"}: ${s.fatal.message}.`;
  }
  if (code === 1011 && lostConnection(code, reason)) {
    return "Connection lost: the gateway heard nothing from this page for too long (keepalive ping timeout).";
  }
  if (code === 1013 && /draining/i.test(reason)) return `The gateway is draining (a restart): ${reason}.`;
  const message = CLOSE_MESSAGES[code] || `Connection closed (code ${code}).`;
  return reason ? `${message} ${reason}` : message;
}

function retryHintMs(s) {
  // the fatal `error` before the close says when trying again may succeed
  return s.fatal && s.fatal.retry_after_s ? s.fatal.retry_after_s * 1000 : 0;
}

function openSocket(sessionId) {
  const scheme = location.protocol === "https:" ? "wss" : "ws";
  const query = sessionId ? `?session_id=${encodeURIComponent(sessionId)}` : "";
  const t = token();
  // browsers cannot send an Authorization header on a WebSocket: the token rides in a
  // subprotocol (never in the URL, which ends up in logs)
  const protocols = t ? ["voice-agent.v1", `voice-agent.token.${t}`] : [];
  if (va.state !== "reconnecting") va.state = "connecting";
  streamSamples = 0;
  sentLog = [];
  speechEnds = {};
  const socket = new WebSocket(`${scheme}://${location.host}/v1/stream${query}`, protocols);
  const s = { ws: socket, opened: false, fatal: null, resuming: sessionId, leaving: false, timer: null };
  ws = socket;
  sock = s;
  socket.binaryType = "arraybuffer";
  socket.onopen = () => { s.opened = true; clearTimeout(s.timer); };
  socket.onmessage = onMessage;
  socket.onclose = (event) => onClose(s, event.code, event.reason);
  s.timer = setTimeout(() => {
    if (!s.opened) abandon(s, 1006, `no answer within ${va.config.connectTimeoutMs / 1000} s`);
  }, va.config.connectTimeoutMs);
}

function abandon(s, code, reason) {
  // stop listening to a socket and go on as if it had closed (a dead network may take
  // minutes to close it for real)
  const socket = s.ws;
  socket.onopen = socket.onmessage = socket.onclose = null;
  try { socket.close(4000, "abandoned"); } catch { /* closed already */ }
  onClose(s, code, reason);
}

function stalled() {
  const unsent = ws.bufferedAmount / (2 * va.sampleRate);
  va.stalls++;
  abandon(sock, 1006, `the network stopped taking the audio (${unsent.toFixed(1)} s unsent)`);
}

function onClose(s, code, reason) {
  if (s !== sock) return; // a socket given up already
  clearTimeout(s.timer);
  ws = sock = null;
  current = null;
  const message = closeMessage(s, code, reason);
  va.closes.push({ code, reason, message });
  logLine("note", null, message);
  if (s.leaving) return finish(message, "idle");
  if (!s.opened && code === 1006) return diagnose(s);
  if (resumeId && resumable(s, code, reason)) return retryLater(message, retryHintMs(s));
  if (code === 1000 || code === 1008) resumeId = null; // it ended, or may not go on
  finish(message, code === 1000 ? "idle" : "error");
}

async function diagnose(s) {
  // A refused upgrade (a bad or expired token, an Origin not allowed, a limit) reaches a
  // page as a bare 1006: browsers hide the HTTP answer. The REST API, asked with the same
  // token, says what the gateway thinks of it.
  const round = retry;
  setStatus("The connection closed before it opened: asking the gateway why…", "warn");
  let refusal = null;
  let reachable = true;
  try {
    const response = await fetch("/v1/agents", {
      headers: authHeaders(), cache: "no-store", signal: AbortSignal.timeout(va.config.connectTimeoutMs),
    });
    if (!response.ok) {
      const body = await response.json().catch(() => ({}));
      const error = (body && body.error) || {};
      refusal = {
        status: response.status, code: error.code || `HTTP ${response.status}`,
        message: error.message || response.statusText, retryAfterS: Number(response.headers.get("Retry-After")) || 0,
      };
    }
  } catch {
    reachable = false;
  }
  if (round !== retry || sock || va.state === "idle") return; // the user acted meanwhile
  const resuming = s.resuming;
  if (refusal) {
    va.refusals.push(refusal);
    const what = ERROR_MESSAGES[refusal.code] || "Refused";
    let message = `${what} (HTTP ${refusal.status} ${refusal.code}): ${refusal.message}.`;
    if (refusal.status === 429 && refusal.code === "rate_limited" && resuming) {
      return retryLater(message, refusal.retryAfterS * 1000);
    }
    if (refusal.status >= 500 && resuming) return retryLater(message);
    if (resuming && refusal.status === 401) {
      message += ` Paste a new token and press Connect to resume session ${resuming}.`;
    }
    return giveUp(message);
  }
  if (!reachable) {
    const message = `The gateway at ${location.host} is unreachable.`;
    return resuming ? retryLater(message) : giveUp(message);
  }
  const message = "The gateway refused the session before it opened, though it accepts this " +
    "page's token: a limit (sessions at once, new sessions per minute, the daily audio " +
    "quota), this page's origin, or the network; the gateway's log says which.";
  if (resuming) return retryLater(message);
  giveUp(message);
}

function giveUp(message) {
  // the connection ends in an error the user must act on: said in the log and the status
  logLine("note", null, message);
  return finish(message, "error");
}

function retryLater(why, atLeastMs = 0) {
  const cfg = va.config;
  const now = performance.now();
  if (retry.since == null) retry.since = now;
  const elapsed = now - retry.since;
  if (elapsed >= cfg.retryForMs) {
    const message = `${why} Gave up reconnecting after ${Math.round(elapsed / 1000)} s: ` +
      `press Connect to resume session ${resumeId} (the gateway keeps it a few minutes).`;
    return giveUp(message);
  }
  const backoff = Math.min(cfg.retryMaxMs, cfg.retryBaseMs * 2 ** retry.attempt);
  const delay = Math.max(atLeastMs, backoff * (0.75 + Math.random() * 0.5)); // spread out
  retry.attempt++;
  va.state = "reconnecting";
  setStatus(`${why} Reconnecting to session ${resumeId} in ${(delay / 1000).toFixed(1)} s ` +
    `(attempt ${retry.attempt})…`, "warn");
  $("connect").disabled = true;
  $("disconnect").disabled = false;
  retry.timer = setTimeout(() => {
    retry.timer = null;
    try {
      openSocket(resumeId);
    } catch (err) {
      retryLater(`Cannot connect: ${err.message}.`);
    }
  }, delay);
}

function finish(message, kind) {
  // idle: nothing open, nothing pending; `resumeId` stays for Connect to resume with
  clearTimeout(retry.timer);
  retry = { attempt: 0, since: null, timer: null };
  va.state = "idle";
  setStatus(message, kind);
  stopAudio();
  $("connect").disabled = false;
  $("disconnect").disabled = true;
}

async function connect() {
  if (ws || va.state !== "idle") return;
  $("connect").disabled = true;
  if (token() !== listsToken) loadLists(); // a token pasted since: the tenant's lists
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
  setStatus(resumeId ? `Connecting to session ${resumeId}…` : "Connecting…");
  try {
    openSocket(resumeId);
  } catch (err) {
    finish(`Cannot connect: ${err.message}`, "error");
    return;
  }
  $("disconnect").disabled = false;
}

function disconnect() {
  resumeId = null; // the user ended it: the next Connect is a new session
  if (!ws) {
    if (va.state !== "idle") finish("Disconnected.", "idle");
    return;
  }
  sock.leaving = true;
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
  $("voice").addEventListener("change", () => pick("voice", $("voice").value));
  $("agent").addEventListener("change", () => pick("agent", $("agent").value));
  $("token").addEventListener("change", () => { if (token() !== listsToken) loadLists(); });
  loadLists();
}

main();
