#!/usr/bin/env python3
"""A minimal authentication callback for benchmarks (`[[auth.backend]] kind = "http"`):
allows the user `alice` with the password `secret`, answers 404 (unknown) for any other
name and 403 for a wrong password. Counts its calls; `GET /calls` gives the count.

    python3 bench/auth-callback.py 127.0.0.1:18181
"""
import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

CALLS = 0


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def answer(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self.answer(200, {"calls": CALLS})

    def do_POST(self):
        global CALLS
        CALLS += 1
        ask = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
        if ask.get("user") != "alice":
            self.answer(404, {"allow": False})
        elif ask.get("password") != "secret":
            self.answer(403, {"allow": False})
        else:
            self.answer(200, {"allow": True, "groups": ["staff"]})


host, port = sys.argv[1].rsplit(":", 1)
ThreadingHTTPServer((host, int(port)), Handler).serve_forever()
