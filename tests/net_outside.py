#!/usr/bin/env python3
"""net_outside.py - the "outside world" of the network containment tests: a DNS server that logs
every query it receives, and TCP services. Runs inside the test's own network namespace.

  net_outside.py --log FILE --zone NAME=ADDR[,ADDR] [--cname NAME=TARGET] --addr ADDR [--addr ...]

DNS (UDP 53 on every --addr): A/AAAA from --zone, CNAME from --cname, NXDOMAIN otherwise; each
query is logged as "QNAME QTYPE" (one line, flushed) before it is answered.
TCP 8080 and 8081: answer "hello-outside-PORT\\n" and close. TCP 8082: send "tick N\\n" every
100 ms until the peer goes away (a long-lived flow for cutting tests).
"""
import argparse
import ipaddress
import socket
import struct
import sys
import threading
import time


def parse_name(pkt, off):
    labels = []
    while True:
        n = pkt[off]
        if n == 0:
            return ".".join(labels), off + 1
        if n & 0xC0:
            raise ValueError("compressed names are not expected in queries")
        labels.append(pkt[off + 1:off + 1 + n].decode("ascii", "replace"))
        off += 1 + n


def enc_name(name):
    out = b""
    for label in name.strip(".").split("."):
        out += bytes([len(label)]) + label.encode()
    return out + b"\0"


def dns_server(addr, zone, cnames, log):
    fam = socket.AF_INET6 if ":" in addr else socket.AF_INET
    s = socket.socket(fam, socket.SOCK_DGRAM)
    s.bind((addr, 53))
    while True:
        pkt, peer = s.recvfrom(4096)
        try:
            qid, flags, qd = struct.unpack("!HHH", pkt[:6])
            name, off = parse_name(pkt, 12)
            qtype, qclass = struct.unpack("!HH", pkt[off:off + 4])
        except Exception:
            continue
        lname = name.lower().rstrip(".")
        with log["lock"]:
            log["f"].write("%s %d\n" % (lname, qtype))
            log["f"].flush()
        question = pkt[12:off + 4]
        answers = []
        cur = lname
        for _ in range(8):
            if cur in cnames:
                answers.append((cur, 5, enc_name(cnames[cur])))
                cur = cnames[cur]
                continue
            break
        found = cur in zone
        for a in zone.get(cur, []):
            ip = ipaddress.ip_address(a)
            if ip.version == 4 and qtype == 1:
                answers.append((cur, 1, ip.packed))
            elif ip.version == 6 and qtype == 28:
                answers.append((cur, 28, ip.packed))
        rcode = 0 if (found or answers) else 3
        hdr = struct.pack("!HHHHHH", qid, 0x8180 | rcode, 1, len(answers), 0, 0)
        body = question
        for owner, t, rdata in answers:
            body += enc_name(owner) + struct.pack("!HHIH", t, 1, 30, len(rdata)) + rdata
        s.sendto(hdr + body, peer)


def tcp_server(addr, port):
    fam = socket.AF_INET6 if ":" in addr else socket.AF_INET
    s = socket.socket(fam, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((addr, port))
    s.listen(64)

    def serve(c):
        try:
            if port == 8082:
                n = 0
                while True:
                    c.sendall(b"tick %d\n" % n)
                    n += 1
                    time.sleep(0.1)
            else:
                c.sendall(b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\nhello-outside-%d\n" % port)
        except OSError:
            pass
        finally:
            c.close()

    while True:
        c, _ = s.accept()
        threading.Thread(target=serve, args=(c,), daemon=True).start()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--log", required=True)
    ap.add_argument("--addr", action="append", required=True)
    ap.add_argument("--zone", action="append", default=[])
    ap.add_argument("--cname", action="append", default=[])
    a = ap.parse_args()
    zone, cnames = {}, {}
    for z in a.zone:
        k, v = z.split("=", 1)
        zone.setdefault(k.lower(), []).extend(v.split(","))
    for c in a.cname:
        k, v = c.split("=", 1)
        cnames[k.lower()] = v.lower()
    log = {"f": open(a.log, "a"), "lock": threading.Lock()}
    for addr in a.addr:
        threading.Thread(target=dns_server, args=(addr, zone, cnames, log), daemon=True).start()
        for port in (8080, 8081, 8082):
            threading.Thread(target=tcp_server, args=(addr, port), daemon=True).start()
    print("ready", flush=True)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    sys.exit(main())
