"""A hostile gRPC client below grpcio: HTTP/2 streams (the ``h2`` package) that each start a ``ModelInfer``
message, send part of it as fast as flow control lets them, and then go quiet, as a client on a stalled link
or an attacker would; grpcio's own client cannot send half a message.
"""

from __future__ import annotations

import select
import socket
import threading
import time

import h2.config
import h2.connection
import h2.events

INFER = "/inference.GRPCInferenceService/ModelInfer"


class HalfSent:
    """``streams`` calls on one connection to ``host:port``, each declaring a ``declared``-byte message and
    sending at most ``sent`` bytes of it (what flow control allows) until :meth:`close`.
    """

    def __init__(self, host: str, port: int, streams: int, declared: int, sent: int, key: str = "") -> None:
        self.sock = socket.create_connection((host, port))
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        self.conn.initiate_connection()
        self.left: dict[int, int] = {}
        self.ended: dict[int, str] = {}
        """Streams the server ended, with their grpc-status."""
        headers = [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", INFER),
            (":authority", f"{host}:{port}"),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
        ] + ([("x-api-key", key)] if key else [])
        for _ in range(streams):
            stream = self.conn.get_next_available_stream_id()
            self.conn.send_headers(stream, headers)
            self.conn.send_data(stream, b"\x00" + declared.to_bytes(4, "big"))
            self.left[stream] = sent
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _pump(self) -> None:
        for stream, left in list(self.left.items()):
            if stream in self.ended or left <= 0:
                continue
            while left > 0 and (room := min(left, self.conn.local_flow_control_window(stream))) > 0:
                frame = min(room, self.conn.max_outbound_frame_size)
                self.conn.send_data(stream, b"\x00" * frame)
                left -= frame
            self.left[stream] = left
        data = self.conn.data_to_send()
        if data:
            self.sock.sendall(data)

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self._pump()
                readable, _, _ = select.select([self.sock], [], [], 0.01)
                if not readable:
                    continue
                data = self.sock.recv(65536)
                if not data:
                    return
                for event in self.conn.receive_data(data):
                    if isinstance(event, h2.events.TrailersReceived | h2.events.ResponseReceived):
                        status = dict(event.headers).get(b"grpc-status")
                        if status is not None:
                            self.ended[event.stream_id] = status.decode()
                    elif isinstance(event, h2.events.StreamReset):
                        self.ended[event.stream_id] = f"reset {event.error_code}"
                    elif isinstance(event, h2.events.DataReceived):
                        self.conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
        except OSError:
            return

    def sent_bytes(self, sent: int) -> int:
        """How much of the messages' bytes went out (``sent``: what each was to send)."""
        return sum(sent - left for left in self.left.values())

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close()


def hold(host: str, port: int, connections: int, streams: int, declared: int, sent: int, seconds: float) -> int:
    """``connections`` x ``streams`` half-sent messages held for ``seconds``; the bytes that went out."""
    clients = [HalfSent(host, port, streams, declared, sent) for _ in range(connections)]
    time.sleep(seconds)
    total = sum(c.sent_bytes(sent) for c in clients)
    for c in clients:
        c.close()
    return total
