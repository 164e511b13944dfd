"""Watches a network device and records how every TCP stream that carries data on it begins.

    python3 first_bytes.py DEVICE STORE_PORT

Prints "ready" on stderr once it listens; on SIGTERM prints one JSON object on stdout:
{"streams": {"SRC:PORT>DST:PORT": ["HEX/LENGTH", ...]}}: for each of a stream's first 4 segments with data, its
first three bytes as hex and its length in bytes, for the streams on neither end of STORE_PORT (the rendezvous
store, whose values the sealed store protects). Gloo's listener reads a pair's 8-byte sequence number in clear
first, to route the connection; a TLS pair then speaks TLS records only (a type 14-17, then 03: a handshake
begins 16 03); a plain pair sends Gloo's own messages. Needs a raw socket (root), as the [netns] tests do."""
import json
import signal
import socket
import struct
import sys

device, store_port = sys.argv[1], int(sys.argv[2])
sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.ntohs(0x0003))
sock.bind((device, 0))
first = {}


def finish(*_):
    print(json.dumps({"streams": first}), flush=True)
    sys.exit(0)


signal.signal(signal.SIGTERM, finish)
print("ready", file=sys.stderr, flush=True)
while True:
    frame = sock.recv(65535)
    if len(frame) < 34 or struct.unpack("!H", frame[12:14])[0] != 0x0800:
        continue
    ip = frame[14:]
    header = (ip[0] & 15) * 4
    if ip[9] != 6:
        continue
    total = struct.unpack("!H", ip[2:4])[0]
    tcp = ip[header:total]
    sport, dport = struct.unpack("!HH", tcp[0:4])
    payload = tcp[(tcp[12] >> 4) * 4:]
    if not payload or store_port in (sport, dport):
        continue
    key = f"{socket.inet_ntoa(ip[12:16])}:{sport}>{socket.inet_ntoa(ip[16:20])}:{dport}"
    segments = first.setdefault(key, [])
    if len(segments) < 4:
        segments.append(f"{payload[:3].hex()}/{len(payload)}")
