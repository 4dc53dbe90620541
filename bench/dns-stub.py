#!/usr/bin/env python3
"""A DNS server for benchmarks: answers every A query with 127.0.0.1 (TTL 3600) and every
other query with no records, over UDP on the address given (default 127.0.0.1:5353).
Used by bench/ab-cost.sh to compare a target named by a name with one named by its
address: after the first lookup, rustle answers from its cache."""
import socket
import struct
import sys

host, port = (sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:5353").rsplit(":", 1)
sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
sock.bind((host, int(port)))
while True:
    query, peer = sock.recvfrom(512)
    if len(query) < 12:
        continue
    ident, flags, qd = struct.unpack("!HHH", query[:6])
    end = 12
    while end < len(query) and query[end] != 0:
        end += query[end] + 1
    question = query[12 : end + 5]
    qtype = struct.unpack("!H", query[end + 1 : end + 3])[0] if end + 3 <= len(query) else 0
    answers = b""
    if qtype == 1:
        answers = b"\xc0\x0c" + struct.pack("!HHIH", 1, 1, 3600, 4) + socket.inet_aton("127.0.0.1")
    count = 1 if answers else 0
    header = struct.pack("!HHHHHH", ident, 0x8180 | (flags & 0x0100), 1, count, 0, 0)
    sock.sendto(header + question + answers, peer)
