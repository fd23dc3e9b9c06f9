"""A small streaming client for the simulator tests (stdlib only): measures what a user measures."""
from __future__ import annotations

import http.client
import json
import time
from dataclasses import dataclass, field
from typing import Any, Optional


@dataclass
class StreamResult:
    status: int
    chunks: list[dict[str, Any]] = field(default_factory=list)
    chunk_t: list[float] = field(default_factory=list)
    done: bool = False
    raw_lines: list[bytes] = field(default_factory=list)
    t_send: float = 0.0

    @property
    def final(self) -> dict[str, Any]:
        return self.chunks[-1]


def request_json(port: int, method: str, path: str, body: Optional[dict] = None,
                 timeout: float = 30.0) -> tuple[int, Any, dict[str, str]]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        data = json.dumps(body).encode() if body is not None else None
        conn.request(method, path, body=data, headers={"Content-Type": "application/json"} if data else {})
        resp = conn.getresponse()
        raw = resp.read()
        headers = {k.lower(): v for k, v in resp.getheaders()}
        try:
            parsed: Any = json.loads(raw) if raw else None
        except json.JSONDecodeError:
            parsed = raw.decode()
        return resp.status, parsed, headers
    finally:
        conn.close()


def stream(port: int, path: str, body: dict, timeout: float = 60.0) -> StreamResult:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        res = StreamResult(status=0, t_send=time.monotonic())
        conn.request("POST", path, body=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        res.status = resp.status
        if resp.status != 200:
            resp.read()
            return res
        while True:
            line = resp.readline()
            if not line:
                break
            res.raw_lines.append(line)
            if not line.startswith(b"data: "):
                continue
            payload = line[6:].strip()
            if payload == b"[DONE]":
                res.done = True
                break
            res.chunks.append(json.loads(payload))
            res.chunk_t.append(time.monotonic())
        return res
    finally:
        conn.close()
