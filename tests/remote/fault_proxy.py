"""An HTTP proxy on loopback for the remote tests, run as its own process (the reader holds the
GIL while it fetches, so nothing in the test's own process could answer it).

    python fault_proxy.py UPSTREAM_URL PORT_FILE

Listens on a free port (written to PORT_FILE). Control, by the test, on the same port:
  POST /__rules  JSON {"path fragment": ["reset"|"half"|"stall"|"corrupt"|"slow"|"trickle"|
                 "error_flood"|"ok", ...]}:
                 successive GETs whose path holds the fragment take the next action; then
                 they pass
  POST /__all_reset  body "1" or "0": answer every request with a reset (a server that is down)
  POST /__release    ends every stall and trickle
  GET  /__state      JSON {"gets": {path: count}, "stalled": bool, "flood_sent": bytes}
Actions: "reset" closes before answering, "half" sends half the body then closes, "stall" sends
half then sends nothing until released, "corrupt" flips one byte of the body, "slow" sends the
body in 16 pieces 0.2 s apart (a slow store: bytes keep coming, for about 3 s), "trickle" sends
64 bytes every 0.25 s until the body is sent or released (a link far too slow to wait for: 2
minutes for 30 KB; "stalled" is set once it begins), "error_flood" answers HTTP 503 with a
256 MiB body, counting in "flood_sent" what went out before the reader hung up.
"""
import http.client
import http.server
import json
import socket
import sys
import threading
import time

upstream = sys.argv[1].split("//", 1)[1]
lock = threading.Lock()
rules, gets = {}, {}
state = {"all_reset": False, "stalled": False, "flood_sent": 0}
release = threading.Event()


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def reply(self, body):
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        data = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        with lock:
            if self.path == "/__rules":
                rules.update(json.loads(data))
            elif self.path == "/__all_reset":
                state["all_reset"] = data == b"1"
            elif self.path == "/__release":
                release.set()
        self.reply(b"ok")

    def do_GET(self):
        if self.path == "/__state":
            with lock:
                self.reply(json.dumps({"gets": gets, "stalled": state["stalled"],
                                       "flood_sent": state["flood_sent"]}).encode())
            return
        with lock:
            gets[self.path] = gets.get(self.path, 0) + 1
            action = "reset" if state["all_reset"] else "ok"
            for fragment, actions in rules.items():
                if fragment in self.path and actions:
                    action = actions.pop(0)
                    break
        if action == "reset":
            self.connection.shutdown(socket.SHUT_RDWR)
            self.close_connection = True
            return
        if action == "error_flood":  # HTTP 503 whose body is 256 MiB (counted as it goes out)
            self.send_response(503)
            self.send_header("Content-Length", str(256 << 20))
            self.end_headers()
            self.close_connection = True
            piece = b"<Error>" + b"x" * (65536 - 7)
            try:
                for _ in range(4096):
                    self.wfile.write(piece)
                    with lock:
                        state["flood_sent"] += len(piece)
            except OSError:
                pass  # the reader hung up
            return
        conn = http.client.HTTPConnection(upstream, timeout=30)
        conn.request("GET", self.path, headers=dict(self.headers.items()))
        resp = conn.getresponse()
        body = resp.read()
        conn.close()
        if action == "corrupt" and body:
            body = bytearray(body)
            body[len(body) // 2] ^= 0x40
            body = bytes(body)
        self.send_response(resp.status)
        for k, v in resp.getheaders():
            if k.lower() not in ("content-length", "transfer-encoding", "connection"):
                self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if action in ("stall", "half"):
            self.wfile.write(body[:len(body) // 2])
            self.wfile.flush()
            if action == "stall":
                with lock:
                    state["stalled"] = True
                release.wait(300)
            self.connection.shutdown(socket.SHUT_RDWR)
            self.close_connection = True
            return
        if action == "trickle":
            with lock:
                state["stalled"] = True
            self.close_connection = True
            try:
                for at in range(0, len(body), 64):
                    if release.wait(0.25):
                        break
                    self.wfile.write(body[at:at + 64])
                    self.wfile.flush()
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # the reader went away (cancelled)
            return
        if action == "slow":
            piece = max(1, (len(body) + 15) // 16)
            for at in range(0, len(body), piece):
                self.wfile.write(body[at:at + piece])
                self.wfile.flush()
                time.sleep(0.2)
            return
        self.wfile.write(body)


server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
server.daemon_threads = True
with open(sys.argv[2] + ".tmp", "w") as f:
    f.write(str(server.server_address[1]))
import os  # noqa: E402
os.rename(sys.argv[2] + ".tmp", sys.argv[2])
server.serve_forever()
