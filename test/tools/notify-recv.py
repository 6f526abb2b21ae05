#!/usr/bin/env python3
"""A stand-in for systemd's NOTIFY_SOCKET, for tests that run without systemd.

usage: notify-recv.py SOCKET_PATH [MAX_SECONDS]

Binds a unix datagram socket at SOCKET_PATH (or the abstract name after a leading '@'),
prints `listening <path>` once it can receive, then one JSON line per datagram:
  {"pid": 123, "uid": 0, "gid": 0, "fds": 0, "msg": "READY=1\\nSTATUS=..."}
pid/uid/gid are the sender's credentials as the kernel reports them (SO_PASSCRED), the
same ones systemd checks against NotifyAccess=. Node has no unix datagram sockets, which
is why this is Python.

When its stdin is a pipe or a socket it exits as that pipe reaches end-of-file (the test that started
it is gone, so nothing is left listening); in any case after MAX_SECONDS (default 120).
"""
import json
import os
import select
import stat
import socket
import struct
import sys
import time

CRED = struct.Struct('iII')  # struct ucred: pid_t pid; uid_t uid; gid_t gid


def main() -> int:
    if len(sys.argv) not in (2, 3):
        print(__doc__.strip(), file=sys.stderr)
        return 2
    path = sys.argv[1]
    deadline = time.monotonic() + float(sys.argv[2] if len(sys.argv) == 3 else 120)
    abstract = path.startswith('@')

    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    if abstract:
        sock.bind('\0' + path[1:])
    else:
        if os.path.lexists(path):
            os.unlink(path)
        sock.bind(path)
        # A service that dropped to another user must still be able to send (systemd's own
        # socket accepts any local sender; NotifyAccess= decides what it listens to).
        os.chmod(path, 0o666)
    # Without SO_PASSCRED the kernel attaches no sender credentials to what we receive.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
    print(f'listening {path}', flush=True)

    ancillary = socket.CMSG_SPACE(CRED.size) + socket.CMSG_SPACE(64 * 4)
    watched = [sock]
    stdin_mode = os.fstat(0).st_mode
    # A pipe or a socket pair (what Node gives a child for a piped stdin), not /dev/null.
    if stat.S_ISFIFO(stdin_mode) or stat.S_ISSOCK(stdin_mode):
        watched.append(sys.stdin)
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return 0
        readable, _, _ = select.select(watched, [], [], left)
        if sys.stdin in readable:
            if not os.read(sys.stdin.fileno(), 4096):
                return 0
        if sock not in readable:
            continue
        data, anc, _flags, _addr = sock.recvmsg(65536, ancillary)
        pid = uid = gid = None
        fds = []
        for level, kind, payload in anc:
            if level != socket.SOL_SOCKET:
                continue
            if kind == socket.SCM_CREDENTIALS:
                pid, uid, gid = CRED.unpack(payload[:CRED.size])
            elif kind == socket.SCM_RIGHTS:
                n = len(payload) // 4
                fds.extend(struct.unpack(f'{n}i', payload[:n * 4]))
        # systemd-notify's BARRIER=1 passes a pipe and waits until every copy of it is closed.
        for fd in fds:
            os.close(fd)
        line = {'pid': pid, 'uid': uid, 'gid': gid, 'fds': len(fds), 'msg': data.decode('utf-8', 'replace')}
        print(json.dumps(line), flush=True)


if __name__ == '__main__':
    sys.exit(main())
