"""Helpers for the end-to-end tests: word recall, raw WebSocket frames, test audio files."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import os
import re
import socket
from typing import Any

import av
import numpy as np
import numpy.typing as npt
import websockets
import websockets.asyncio.client
from websockets.asyncio.client import ClientConnection

Json = dict[str, Any]


def words(text: str) -> list[str]:
    return re.findall(r"[a-z']+", text.lower())


def recall(expected: str, heard: str) -> float:
    """Share of expected words that were heard (order-free, with multiplicity)."""
    pool = words(heard)
    found = 0
    for word in words(expected):
        if word in pool:
            pool.remove(word)
            found += 1
    return found / max(1, len(words(expected)))


def encode_file(
    audio: npt.NDArray[np.float32], rate: int, container: str, codec: str, channels: int = 1
) -> bytes:
    """Encode test speech with PyAV into any container/codec pair (e.g. webm/libopus)."""
    layout = "mono" if channels == 1 else "stereo"
    planes = np.stack([audio] * channels).astype(np.float32)
    buf = io.BytesIO()
    with av.open(buf, mode="w", format=container) as out:
        options = {"strict": "-2"} if codec == "vorbis" else {}  # ffmpeg's own vorbis encoder
        stream: Any = out.add_stream(codec, rate=rate, layout=layout, options=options)
        frame = av.AudioFrame.from_ndarray(planes, format="fltp", layout=layout)
        frame.sample_rate = rate
        for packet in stream.encode(frame):
            out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return buf.getvalue()


async def recv_json(ws: ClientConnection, timeout_s: float = 10.0) -> Json:
    """The next text frame (binary frames in between are skipped)."""
    async with asyncio.timeout(timeout_s):
        while True:
            message = await ws.recv()
            if isinstance(message, str):
                event: Json = json.loads(message)
                return event


async def recv_until(
    ws: ClientConnection, kind: str, timeout_s: float = 10.0
) -> tuple[Json, list[Json], bytes]:
    """Read until an event of type `kind`; returns it, the events before it and the audio."""
    seen: list[Json] = []
    audio = bytearray()
    async with asyncio.timeout(timeout_s):
        while True:
            message = await ws.recv()
            if isinstance(message, bytes):
                audio.extend(message)
                continue
            event: Json = json.loads(message)
            if event.get("type") == kind:
                return event, seen, bytes(audio)
            seen.append(event)


async def send_json(ws: ClientConnection, message: Json) -> None:
    await ws.send(json.dumps(message))


def connect(url: str) -> websockets.asyncio.client.connect:
    """A raw client connection, as a browser would open it (no compression, no size cap)."""
    return websockets.asyncio.client.connect(url, compression=None, max_size=None)


async def read_to_close(ws: ClientConnection, timeout_s: float = 10.0) -> tuple[list[Json], int]:
    """Read until the server closes; returns the events seen and the close code it sent."""
    seen: list[Json] = []
    async with asyncio.timeout(timeout_s):
        try:
            while True:
                message = await ws.recv()
                if isinstance(message, str):
                    seen.append(json.loads(message))
        except websockets.ConnectionClosed as closed:
            assert closed.rcvd is not None, f"no close frame from the server: {closed}"
            return seen, closed.rcvd.code


async def send_to_close(ws: ClientConnection, message: str | bytes) -> tuple[list[Json], int]:
    """Send a frame the server must refuse, then read to its close: the events seen and its
    close code. A server may close as soon as a frame's header says it is too big, while
    the client is still writing it: the send then ends with the server's close."""
    try:
        await ws.send(message)
    except websockets.ConnectionClosed as closed:
        assert closed.rcvd is not None, f"no close frame from the server: {closed}"
        return [], closed.rcvd.code
    return await read_to_close(ws)


def pipelined(port: int, path: str, *messages: bytes, until: bytes) -> bytes:
    """A raw client that sends the upgrade request and masked text frames in one write,
    without waiting for the 101 (RFC 6455 says to wait; some clients do not); returns what
    came back, read until `until` arrives or the server is quiet for 2 s."""
    key = base64.b64encode(os.urandom(16)).decode()
    request = (
        f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
        f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
    ).encode()
    frames = b""
    for payload in messages:  # short frames only: a 7-bit length
        mask = os.urandom(4)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        frames += bytes([0x81, 0x80 | len(payload)]) + mask + masked
    received = b""
    with socket.create_connection(("127.0.0.1", port), timeout=2) as sock:
        sock.sendall(request + frames)
        try:
            while until not in received and (chunk := sock.recv(4096)):
                received += chunk
        except TimeoutError:
            pass
    return received
