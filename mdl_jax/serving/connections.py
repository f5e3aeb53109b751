"""The HTTP/1.1 server both servers run on: uvicorn on an already bound socket, with the connection
guards uvicorn lacks (a header timeout, a connection limit that sheds slow clients first, a request
framed two ways refused, OpenAI-shaped answers to what h11 cannot parse, a deadline for a client to take
what it is sent). Its limits are ``Limits`` (``mdl_jax.serving.protocol``); nothing a client sends is
logged (no access log).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import socket
import struct

from mdl_jax.serving.protocol import LIMITS, APIError, Limits


def bind(host: str, port: int) -> socket.socket:
    """A listening socket (so the port is known, and taken, before the first request)."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def _raw_error(status: int, reason: str, message: str, code: str) -> bytes:
    """A whole HTTP/1.1 error answer, written below h11 (no request was parsed to answer)."""
    body = json.dumps(APIError(status, message, "invalid_request_error" if status < 500 else "server_error",
                               code=code).body()).encode()
    return (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n").encode() + body


def guarded_protocol(limits: Limits):
    """uvicorn's h11 protocol with what it lacks against slow clients (slowloris): a header timeout
    (uvicorn times out idle keep-alive connections only, not a connection that never completes its
    headers) and a connection limit that sheds the connections still sending headers, oldest first,
    before refusing anyone, so a real client is served beside thousands of slow ones; and a send
    deadline (``send_timeout_s``): a client that does not take its answer is reset, not kept."""
    import h11
    from uvicorn.protocols.http.h11_impl import DEFAULT_MAX_INCOMPLETE_EVENT_SIZE, H11Protocol

    waiting: dict = {}  # connections whose next request's headers are not complete, oldest first

    class AmbiguousFraming(Exception):
        """A request framed both by Content-Length and by Transfer-Encoding."""

    class FramedOnce(h11.Connection):
        """h11 frames such a request by Transfer-Encoding and reads on (RFC 9112 allows it only
        if the connection is closed after the answer; h11 keeps it): refuse it instead."""

        def next_event(self):
            event = super().next_event()
            if isinstance(event, h11.Request):
                names = {name for name, _ in event.headers}  # h11 gives them lower-cased
                if b"content-length" in names and b"transfer-encoding" in names:
                    raise AmbiguousFraming
            return event

    class GuardedH11(H11Protocol):
        _header_timer: asyncio.TimerHandle | None = None
        _got_bytes = False

        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            size = self.config.h11_max_incomplete_event_size  # as uvicorn makes its connection
            self.conn = FramedOnce(h11.SERVER, DEFAULT_MAX_INCOMPLETE_EVENT_SIZE if size is None else size)

        def handle_events(self) -> None:
            try:
                super().handle_events()
            except AmbiguousFraming:
                # answered below h11 and closed: nothing after these headers is read, so bytes a
                # proxy took for this request's body are never served as a request of their own
                self._disarm()
                self.transport.write(_raw_error(
                    400, "Bad Request", "a request with both Content-Length and Transfer-Encoding is "
                    "refused (ambiguous framing, RFC 9112 section 6.1)", "ambiguous_framing"))
                self.transport.close()

        def send_400_response(self, msg: str) -> None:
            # uvicorn answers a request h11 cannot parse in text/plain: OpenAI's error shape instead
            self._disarm()
            self.transport.write(_raw_error(400, "Bad Request", "not a valid HTTP/1.1 request (its request line, "
                                            "a header or Content-Length is malformed, or its headers are too large)",
                                            "invalid_http"))
            self.transport.close()

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            if len(self.connections) > limits.max_connections:
                victim = next((c for c in waiting if c is not self), None)
                if victim is None:
                    transport.write(_raw_error(503, "Service Unavailable",
                                               f"server busy: {limits.max_connections} connections open",
                                               "overloaded"))
                    transport.close()
                    return
                victim._expire(shed=True)
            self._arm()

        def _arm(self) -> None:
            self._disarm()
            self._got_bytes = False
            self._header_timer = self.loop.call_later(limits.header_timeout_s, self._expire)
            waiting[self] = None

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None
            waiting.pop(self, None)

        def _expire(self, shed: bool = False) -> None:
            self._disarm()
            if self.transport.is_closing():
                return
            if self._got_bytes:  # a partial request: say why (a silent idle one is just closed)
                why = (f"headers not received within {limits.header_timeout_s:g} s" if not shed else
                       f"closed to make room: {limits.max_connections} connections open")
                self.transport.write(_raw_error(408, "Request Timeout", why, "request_timeout"))
            self.transport.close()

        def data_received(self, data: bytes) -> None:
            self._got_bytes = True
            super().data_received(data)
            if self._header_timer is not None and self.conn.their_state is not h11.IDLE:
                self._disarm()  # the headers are in: the body has its own timeout (read_json)

        def on_response_complete(self) -> None:
            if self.transport.get_write_buffer_size() and not self.flow.write_paused:
                self._send_clock(True)  # an ended answer still waiting to go out (paused: timed from the pause)
            super().on_response_complete()
            if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
                self._arm()  # the next request's headers (uvicorn's keep-alive closes a silent one)

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            self._send_clock(False)
            super().connection_lost(exc)

        # The send deadline. uvicorn waits for a client before a write, never after one: a whole answer
        # goes into the transport's buffer at once, and a close waits for the client to take it (asyncio
        # flushes first), so a client that read nothing kept the buffer and its connection for good.
        # The deadline is for a client that takes nothing, not for one that reads slowly: a big answer to
        # a slow but steady reader may take longer than it to go out, and each time some has gone the
        # clock starts again.
        _send_timer: asyncio.TimerHandle | None = None
        _send_left = 0  # the bytes waiting when the clock started

        def _send_clock(self, start: bool) -> None:
            if self._send_timer is not None:
                self._send_timer.cancel()
            self._send_timer = self.loop.call_later(limits.send_timeout_s, self._send_expired) if start else None
            self._send_left = self.transport.get_write_buffer_size() if start else 0

        def _send_expired(self) -> None:
            left = self.transport.get_write_buffer_size()
            # stuck: over the high-water mark, or an ended answer not yet gone (a later pipelined
            # answer on its way, not paused, is not)
            if not left or not (self.flow.write_paused or self.cycle is None or self.cycle.response_complete):
                return
            if left < self._send_left:  # some went out since the clock started: slow, not stopped
                self._send_clock(True)
                return
            self.logger.warning("closed the connection of %s: %d bytes of its answer not taken within %g s "
                                "(send_timeout_s)", ":".join(map(str, self.client)) if self.client else "a client",
                                left, limits.send_timeout_s)
            with contextlib.suppress(OSError, AttributeError):  # a reset frees the kernel's copy too
                self.transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                                                   struct.pack("ii", 1, 0))
            self.transport.abort()

        def pause_writing(self) -> None:
            super().pause_writing()
            self._send_clock(True)

        def resume_writing(self) -> None:
            super().resume_writing()
            # the client took some: a fresh clock for an ended answer's rest; a stream's runs from its next pause
            self._send_clock(bool(self.cycle is not None and self.cycle.response_complete
                                  and self.transport.get_write_buffer_size()))

    return GuardedH11


def run_app(app, sock: socket.socket, limits: Limits = LIMITS) -> None:
    """uvicorn on an already bound socket with the connection limits of ``limits`` (header timeout,
    keep-alive timeout, connection limit, send deadline); no access log (nothing a client sends, an API key
    included, is ever written out)."""
    import resource

    import uvicorn

    # every connection is a file descriptor: make room for the connection limit if the hard limit lets
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = limits.max_connections + 256
    if soft < want and (hard == resource.RLIM_INFINITY or soft < hard):
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (want if hard == resource.RLIM_INFINITY
                                                        else min(want, hard), hard))
    config = uvicorn.Config(app, http=guarded_protocol(limits),
                            timeout_keep_alive=math.ceil(limits.keep_alive_s),  # uvicorn: whole s
                            log_level="warning", access_log=False, lifespan="on",
                            timeout_graceful_shutdown=2)
    server = uvicorn.Server(config)
    try:
        asyncio.run(server.serve(sockets=[sock]))
    except KeyboardInterrupt:
        pass
