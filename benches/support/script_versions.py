#!/usr/bin/env python3
"""The decision script of several commits side by side, Redis' cost alone.

Each commit's lua/ files are concatenated as its script.rs did; each is sent the arguments its
own protocol reads (decimal per call, or the binary argument), for one script call of C calls
on one hot key, back to back on one connection to a redis-server started here on a loopback
port. Redis' INFO commandstats gives the microseconds per script call.

  taskset -c 0 python3 benches/support/script_versions.py 641ff13=641ff13:dec9 \
      6409ab4=6409ab4:dec10 HEAD=HEAD:bin7

Protocols: dec9 (641ff13: clock, mode, count, six numbers per key, all decimal), dec10 (a
deadline after the clock), bin6 (the numbers as one binary argument, keys once per call), bin7
(seven numbers per key, the last where its key is; each key once).
"""
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time

FILES = ['common', 'sliding_packed', 'sliding_hash', 'sliding_window', 'token_bucket', 'fixed_window', 'check']
OPS = {'sliding window': (1, 16666, 10**9, 1, 0, 0), 'token bucket': (2, 10**9, 0, 1, 10**6, 0),
       'fixed window': (3, 10**6, 10**9, 1, 0, 0)}


def source(commit):
    parts = []
    for name in FILES:
        got = subprocess.run(['git', 'show', f'{commit}:lua/{name}.lua'], capture_output=True)
        if got.returncode == 0:
            parts.append(got.stdout)
    return b''.join(parts)


def resp(args):
    out = b'*%d\r\n' % len(args)
    for a in args:
        a = a if isinstance(a, bytes) else str(a).encode()
        out += b'$%d\r\n%s\r\n' % (len(a), a)
    return out


def reply(f):
    line = f.readline()
    kind = line[:1]
    if kind in (b'+', b'-', b':'):
        if kind == b'-':
            raise RuntimeError(line)
        return line
    if kind == b'$':
        n = int(line[1:])
        return None if n < 0 else f.read(n + 2)[:-2]
    if kind == b'*':
        return [reply(f) for _ in range(int(line[1:]))]
    raise RuntimeError(line)


def arguments(protocol, key, calls, numbers):
    if protocol.startswith('dec'):
        head = ['0', '0', '1'] if protocol == 'dec9' else ['0', '0', '0', '1']
        argv = [str(calls), '0'] + (head + [str(n) for n in numbers]) * calls
        return [str(calls)] + [key] * calls + argv
    per_key = list(numbers) + ([1] if protocol == 'bin7' else [])
    blob = struct.pack('>2q', calls, 0) + (struct.pack('>4q', 0, 0, 0, 1) +
                                           struct.pack('>%dq' % len(per_key), *per_key)) * calls
    keys = [key] if protocol == 'bin7' else [key] * calls
    return [str(len(keys))] + keys + [blob]


def main():
    versions = [v.split('=', 1) for v in sys.argv[1:]]
    rounds = 5000
    with tempfile.TemporaryDirectory() as d:
        probe = socket.socket()
        probe.bind(('127.0.0.1', 0))
        port = probe.getsockname()[1]
        probe.close()
        # Redis on a core of its own when taskset is at hand (run this script pinned to another:
        # `taskset -c 0 python3 ...`): usec_per_call is wall time inside the script.
        pin = ['taskset', '-c', '1'] if shutil.which('taskset') else []
        server = subprocess.Popen(pin + ['redis-server', '--port', str(port), '--bind', '127.0.0.1',
                                   '--save', '', '--appendonly', 'no', '--dir', d],
                                  stdout=subprocess.DEVNULL)
        try:
            for _ in range(100):
                try:
                    conn = socket.create_connection(('127.0.0.1', port))
                    break
                except OSError:
                    time.sleep(0.05)
            f = conn.makefile('rb')

            def call(args):
                conn.sendall(resp(args))
                return reply(f)

            print('| script | algorithm | 1 call | 8 calls | 64 calls | µs per more call |')
            print('|---|---|---|---|---|---|')
            for label, spec in versions:
                commit, protocol = spec.split(':')
                sha = call(['SCRIPT', 'LOAD', source(commit)]).decode()
                for name, numbers in OPS.items():
                    row = []
                    for calls in (1, 8, 64):
                        key = '{cost}%s:%s:%d' % (label, name, calls)
                        args = ['EVALSHA', sha] + arguments(protocol, key, calls, numbers)
                        call(args)
                        call(['CONFIG', 'RESETSTAT'])
                        command = resp(args)
                        for _ in range(rounds // 50):
                            conn.sendall(command * 50)
                            for _ in range(50):
                                reply(f)
                        info = call(['INFO', 'commandstats']).decode()
                        line = next(l for l in info.split('\r\n') if l.startswith('cmdstat_evalsha'))
                        row.append(float(line.split('usec_per_call=')[1].split(',')[0]))
                    print('| %s | %s | %.1f | %.1f | %.1f | %.2f |' % (
                        label, name, row[0], row[1], row[2], (row[2] - row[1]) / 56))
        finally:
            server.terminate()
            server.wait()


if __name__ == '__main__':
    main()
