"""S3 on loopback for the fault campaign: moto's server, and a proxy that breaks requests.

    moto = MotoS3()                                   # http://127.0.0.1:<port>, test credentials set
    proxy = FaultProxy(moto.url, rate=0.1)            # point clients at proxy.url
    ... ; proxy.counts                                # {'ok': n, '503': n, 'reset-before': n, ...}

Used by ``coevolve.bench.reliability`` (``coevolve bench reliability``) and its tests.
"""

from __future__ import annotations

import os
import random
import socket
import struct
import threading
import time

from coevolve.processes import free_port


class FaultProxy:
    """An HTTP proxy on loopback in front of an S3 endpoint that breaks a share of requests:
    a 503 SlowDown answer, a connection reset before or after the request reached the
    server, or a stall. One request per connection (``Connection: close``)."""

    FAULTS = ("503", "reset-before", "reset-after", "slow")

    def __init__(self, upstream: str, rate: float, seed: int = 0, slow_s: float = 1.5):
        host, port = upstream.split("://", 1)[1].split(":")
        self.upstream = (host, int(port))
        self.rate, self.slow_s = rate, slow_s
        self.rng = random.Random(seed)
        self.counts = {f: 0 for f in ("ok", *self.FAULTS)}
        self._lock = threading.Lock()
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self._stop = False
        threading.Thread(target=self._serve, daemon=True).start()

    def close(self) -> None:
        self._stop = True
        self.sock.close()

    def _serve(self) -> None:
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _fault(self) -> str:
        with self._lock:
            f = self.rng.choice(self.FAULTS) if self.rng.random() < self.rate else "ok"
            self.counts[f] += 1
            return f

    @staticmethod
    def _read_request(conn: socket.socket) -> bytes | None:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                return None
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        headers = {
            k.strip().lower(): v.strip()
            for k, _, v in (line.decode("latin-1").partition(":") for line in head.split(b"\r\n")[1:])
        }
        if "content-length" in headers:
            need = int(headers["content-length"])
            while len(body) < need:
                chunk = conn.recv(65536)
                if not chunk:
                    return None
                body += chunk
        elif headers.get("transfer-encoding", "").lower() == "chunked":
            while not body.endswith(b"0\r\n\r\n"):
                chunk = conn.recv(65536)
                if not chunk:
                    return None
                body += chunk
        lines = [x for x in head.split(b"\r\n") if not x.lower().startswith(b"connection:")]
        return b"\r\n".join(lines + [b"Connection: close"]) + b"\r\n\r\n" + body

    @staticmethod
    def _reset(conn: socket.socket) -> None:
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        conn.close()

    def _handle(self, conn: socket.socket) -> None:
        try:
            request = self._read_request(conn)
            if request is None:
                conn.close()
                return
            fault = self._fault()
            if fault == "reset-before":
                return self._reset(conn)
            if fault == "503":
                body = b"<Error><Code>SlowDown</Code><Message>injected</Message></Error>"
                conn.sendall(
                    b"HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\nContent-Length: "
                    + str(len(body)).encode()
                    + b"\r\nConnection: close\r\n\r\n"
                    + body
                )
                conn.close()
                return
            if fault == "slow":
                time.sleep(self.slow_s)
            with socket.create_connection(self.upstream, timeout=30) as up:
                up.sendall(request)
                response = b""
                while True:
                    chunk = up.recv(65536)
                    if not chunk:
                        break
                    response += chunk
            if fault == "reset-after":  # the server did it; the client never hears
                return self._reset(conn)
            head, sep, body = response.partition(b"\r\n\r\n")
            lines = [x for x in head.split(b"\r\n") if not x.lower().startswith(b"connection:")]
            conn.sendall(b"\r\n".join(lines + [b"Connection: close"]) + sep + body)
            conn.close()
        except OSError:
            conn.close()


class MotoS3:
    """moto's S3 server on loopback, with test credentials in this process's environment."""

    def __init__(self) -> None:
        import logging

        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise

        port = free_port()
        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
        self.server.start()
        os.environ.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_REGION="us-east-1")
        self.url = f"http://127.0.0.1:{port}"

    def bucket(self, name: str) -> str:
        import boto3

        boto3.client("s3", endpoint_url=self.url).create_bucket(Bucket=name)
        return name

    def stop(self) -> None:
        self.server.stop()
