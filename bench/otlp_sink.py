"""
An OTLP/HTTP endpoint that accepts every export and keeps nothing, for benchmarks of the broker
with tracing on (bench/instructions.sh): the exporter's work is the broker's, the sink's is not.

usage: python bench/otlp_sink.py PORT    (loopback only; stop it by its PID)
"""

import http.server
import sys


class Sink(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get('Content-Length', '0')))
        self.send_response(200)
        self.send_header('Content-Type', 'application/x-protobuf')
        self.send_header('Content-Length', '0')
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


if __name__ == '__main__':
    http.server.ThreadingHTTPServer(('127.0.0.1', int(sys.argv[1])), Sink).serve_forever()
