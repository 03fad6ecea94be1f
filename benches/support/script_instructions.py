#!/usr/bin/env python3
"""Instructions Redis spends per decision of the decision script on the cold path, counted by
valgrind's callgrind: the same count for the same binary and inputs whatever else the machine
is doing, where a wall-clock or `usec_per_call` figure on this shared 2-core machine moves by
+-20%. For profiling a change to `lua/` (a script change judged by its count, side by side with
the commit before), never as a timed test.

Starts redis-server (Debian's, or $REDIS_SERVER_BIN) under callgrind on a free loopback port,
loads the decision script of each `lua/` directory given (as a function library when its
check.lua defines `check`, as this commit's does; else as a script by SCRIPT LOAD, as older
commits'), fills the keyspace with 100,000 keys, then counts the instructions of N script calls
of 10 checks, each on a key never named before (a 60-a-minute rule; the token bucket 100 a
minute), per algorithm. Every process it starts is stopped before it returns.

    python3 benches/support/script_instructions.py lua               this tree's scripts
    git archive HEAD~1 lua | tar -x -C /tmp/base
    python3 benches/support/script_instructions.py lua /tmp/base/lua side by side
    ... --calls 300 --algorithms fixed,sliding,bucket --callgrind-out DIR (keep the profiles
    for callgrind_annotate)
    ... --hot                        script calls of 64 calls on one key (the hot path)
    ... --again-after 1500000        every key met once before, 1.5 s earlier on a fixed clock
                                     (the sliding window's next sub-window of a second)
    ... --hash                       new keys made in 0.1.0's hash layout (`--redis-layout
                                     hash`, 0.2's default): operations 5, 7, 8 where the script
                                     has them (HASH_OPS), else 5 for the sliding window (older
                                     scripts made only hashes for the other two)

The places of the checks' keys are sent negated (each key is named once) to a script that reads
them so, as `script::pack` sends them; plain to an older one.
"""

import argparse
import glob
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time

# held.lua came out of check.lua: an older directory has none.
PARTS = ["common", "sliding_packed", "sliding_hash", "sliding_window", "token_bucket", "fixed_window",
         "concurrency", "claims", "held", "check"]

# The seven numbers of one check (lua/check.lua): operation, unit, four parameters; the place.
CHECKS = {
    "sliding": lambda place: [1, 1_000_000, 60, 1, 0, 0, place],
    "bucket": lambda place: [2, 100, 600_000, 0, 60_000_000, 0, place],
    "fixed": lambda place: [3, 60_000_000, 60, 1, 0, 0, place],
}


def resp(*args):
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        a = a if isinstance(a, bytes) else str(a).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(a), a))
    return b"".join(out)


def hash_op(numbers, source):
    """The check's operation in its hash-layout form, as `script::prefer_hash_layout` sends it."""
    op = numbers[0]
    if "HASH_OPS" in source:
        return [{1: 5, 2: 7, 3: 8}[op]] + numbers[1:]
    return [5 if op == 1 else op] + numbers[1:]


def script_calls(target, algorithm, calls, prefix, negated, hot, now=0, layout=None):
    """`calls` script calls of 10 calls of one check each, every key new; `hot`: of 64 calls on
    one key (a hot key's batch)."""
    out = []
    n = 0
    for _ in range(calls):
        if hot:
            keys = [f"{prefix}{{hot}}"]
            numbers = [64, 0]
            for _ in range(64):
                numbers += [0, 0, 0, 1] + layout(CHECKS[algorithm](1))
        else:
            keys, numbers = [], [10, 0]
        for j in range(0 if hot else 10):
            n += 1
            keys.append(f"{prefix}{{u{n}}}")
            place = -(j + 1) if negated else j + 1
            # Mode 4: each alone, on a key named once (script::ALONE_ONCE), where it is read.
            numbers += [now, 0, 4 if negated else 0, 1] + layout(CHECKS[algorithm](place))
        packed = struct.pack(">%dq" % len(numbers), *numbers)
        verb = "FCALL" if target.startswith("fn:") else "EVALSHA"
        out.append(resp(verb, target.removeprefix("fn:"), len(keys), *keys, packed))
    return b"".join(out)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cli(port, *args, stdin=None):
    return subprocess.run(["redis-cli", "-h", "127.0.0.1", "-p", str(port), *args],
                          input=stdin, capture_output=True, check=True).stdout


def count(lua_dir, algorithm, calls, keep, hot, again_after, hash_layout):
    source = "".join(open(os.path.join(lua_dir, f"{p}.lua")).read() for p in PARTS
                     if os.path.exists(os.path.join(lua_dir, f"{p}.lua")))
    # Places negated and mode 4 where the script reads them so, as pack sends them.
    negated = "if at < 0 then" in source and "local once = mode == 4" in source
    layout = (lambda n: hash_op(n, source)) if hash_layout else (lambda n: n)
    port = free_port()
    work = tempfile.mkdtemp(prefix="callgrind-")
    server = os.environ.get("REDIS_SERVER_BIN", "redis-server")
    proc = subprocess.Popen(
        ["valgrind", "--tool=callgrind", "--instr-atstart=no",
         f"--callgrind-out-file={work}/out", server, "--port", str(port), "--bind", "127.0.0.1",
         "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(200):
            try:
                if cli(port, "PING").strip() == b"PONG":
                    break
            except subprocess.CalledProcessError:
                pass
            time.sleep(0.1)
        else:
            raise SystemExit("redis-server under valgrind did not start")
        if "local function check(KEYS, ARGV)" in source:
            library = (f"#!lua name=count\n{source}\nredis.register_function{{function_name = "
                       "'count', callback = check, flags = {'allow-cross-slot-keys'}}\n")
            cli(port, "FUNCTION", "LOAD", library)
            target = "fn:count"
        else:
            target = cli(port, "SCRIPT", "LOAD", source).decode().strip()
        cli(port, "DEBUG", "POPULATE", "100000", "filler", "10")
        cli(port, "--pipe", stdin=script_calls(target, algorithm, 50, "warm", negated, hot, 0, layout))
        # Met again: the same keys first, at a fixed clock, then `again_after` µs later.
        start = (int(time.time()) + 1) * 1_000_000 + 250_000
        if again_after is not None:
            cli(port, "--pipe",
                stdin=script_calls(target, algorithm, calls, "k", negated, hot, start, layout))
        subprocess.run(["callgrind_control", "-i", "on", str(proc.pid)], capture_output=True)
        now = 0 if again_after is None else start + again_after
        piped = cli(port, "--pipe",
                    stdin=script_calls(target, algorithm, calls, "k", negated, hot, now, layout))
        subprocess.run(["callgrind_control", "-i", "off", str(proc.pid)], capture_output=True)
        subprocess.run(["callgrind_control", "-d", str(proc.pid)], capture_output=True)
        if b"errors: 0" not in piped:
            raise SystemExit(f"the script calls failed: {piped.decode()}")
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    total = 0
    for path in glob.glob(f"{work}/out*"):
        for line in open(path):
            if line.startswith("totals:"):
                total += int(line.split()[1])
    if keep:
        os.makedirs(keep, exist_ok=True)
        for path in glob.glob(f"{work}/out*"):
            shutil.copy(path, os.path.join(keep, f"{algorithm}-{os.path.basename(path)}"))
    shutil.rmtree(work)
    return total / (calls * (64 if hot else 10))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("dirs", nargs="+", help="lua/ directories: this one, then others")
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--algorithms", default="sliding,bucket,fixed")
    parser.add_argument("--callgrind-out", default=None)
    parser.add_argument("--again-after", type=int, default=None, metavar="US",
                        help="the keys met once before, this many µs earlier (a fixed clock)")
    parser.add_argument("--hot", action="store_true",
                        help="script calls of 64 calls on one key instead (per decision)")
    parser.add_argument("--hash", action="store_true",
                        help="new keys in 0.1.0's hash layout (--redis-layout hash)")
    args = parser.parse_args()
    print("| algorithm | " + " | ".join(args.dirs) + " |")
    print("|---|" + "---|" * len(args.dirs))
    for algorithm in args.algorithms.split(","):
        cells = []
        for i, lua_dir in enumerate(args.dirs):
            keep = args.callgrind_out and os.path.join(args.callgrind_out, str(i))
            cells.append(count(lua_dir, algorithm, args.calls, keep, args.hot, args.again_after,
                               args.hash))
        ratio = f" (x {cells[0] / cells[1]:.2f})" if len(cells) > 1 else ""
        print(f"| {algorithm} | " + " | ".join(f"{c:,.0f}" for c in cells) + ratio + " |")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
