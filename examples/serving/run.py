"""Starts the whole system on loopback, runs the traffic, injects faults,
stops everything and runs the checker. scripts/serving.sh calls it.

    run.py [--flow vllm|trtllm|both] [--faults] [--seconds N] [--seed S] [--rate R]
           [--hold-ms MS] [--bug NAME] [--out DIR]

Per flow: one nats-server (JetStream on in the trtllm flow), one etcd, two
prefill-handoff workers, two prefill engines, two decode engines and the
frontend, each process with its own event log in the run directory. The
vllm flow runs the workers in core mode (decode engines in a queue group),
the trtllm flow in JetStream mode (decode engines share a durable pull
consumer on the GEN stream).

With --faults, at times drawn from the seed: SIGKILL of a handoff worker
and its restart; SIGKILL of a decode engine and its restart; etcd stopped
for longer than the lease TTL and started again; in the JetStream flow a
nats-server restart. Every fault is logged in faults.jsonl with when it
began and when the processes it touched had recovered; the checker accepts
anomalies (a client timeout, a hold expiry, a second answer) only for
requests sent within that window.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from typing import Any

import checker
import events

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
FLOW_MODE = {"vllm": "core", "trtllm": "jetstream"}
NS = "llm"
LEASE_TTL_S = 3
WORKER_ACK_WAIT_S = 2  # the workers' consumer: a killed worker's results come back after this
DECODE_ACK_WAIT_S = 5  # the decode engines' consumer on GEN
BUG_OWNER = {"double-free": "prefill", "read-after-free": "prefill", "drop-release": "prefill",
             "answer-twice": "decode"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(what: str, cond: Any, timeout: float) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return
        time.sleep(0.05)
    raise RuntimeError(f"timed out waiting for {what}")


def port_open(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
        return True
    except OSError:
        return False


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=0.5) as r:
            return bool(r.status == 200)
    except OSError:
        return False


class Proc:
    def __init__(self, name: str, argv: list[str], out_dir: str, env: dict[str, str] | None = None) -> None:
        self.name, self.argv, self.env = name, argv, env
        self.log_path = os.path.join(out_dir, f"{name}.log")
        self.p: subprocess.Popen[bytes] | None = None

    def start(self) -> Proc:
        env = dict(os.environ, **(self.env or {}))
        with open(self.log_path, "ab") as log:  # the child keeps its own copy
            self.p = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=HERE,
                                      stdin=subprocess.DEVNULL)
        return self

    def alive(self) -> bool:
        return self.p is not None and self.p.poll() is None

    def send(self, sig: int) -> None:
        if self.alive():
            assert self.p is not None
            self.p.send_signal(sig)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10) -> None:
        if self.p is None:
            return
        self.send(sig)
        try:
            self.p.wait(timeout)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()


class System:
    def __init__(self, flow: str, args: Any, out_dir: str, seed: int) -> None:
        self.flow, self.args, self.out, self.seed = flow, args, out_dir, seed
        self.mode = FLOW_MODE[flow]
        self.js = self.mode == "jetstream"
        self.procs: list[Proc] = []
        self.fault_log = events.EventLog(os.path.join(out_dir, "faults.jsonl"), "run")
        self.nats_port, self.etcd_port, self.etcd_peer = free_port(), free_port(), free_port()
        self.nats_url = f"nats://127.0.0.1:{self.nats_port}"
        self.etcd_url = f"http://127.0.0.1:{self.etcd_port}"
        self.workers: list[Proc] = []
        self.worker_ports: list[int] = []
        self.decoders: list[Proc] = []
        self.prefills: list[Proc] = []

    def say(self, msg: str) -> None:
        print(f"serving[{self.flow}]: {msg}", flush=True)

    # --- servers ---------------------------------------------------------------------
    def start_nats(self) -> None:
        conf = os.path.join(self.out, "nats.conf")
        with open(conf, "w") as f:
            f.write(f"listen: 127.0.0.1:{self.nats_port}\n")
            if self.js:
                f.write(f'jetstream {{ store_dir: "{self.out}/jetstream" }}\n')
        self.nats = Proc("nats", [self.args.nats_server, "-c", conf], self.out).start()
        wait_until("nats-server", lambda: port_open(self.nats_port), 15)

    def start_etcd(self) -> None:
        peer = f"http://127.0.0.1:{self.etcd_peer}"
        self.etcd = Proc("etcd", [self.args.etcd, "--name", "serving", "--data-dir", f"{self.out}/etcd",
                                  "--listen-client-urls", self.etcd_url, "--advertise-client-urls", self.etcd_url,
                                  "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                                  "--initial-cluster", f"serving={peer}"], self.out).start()
        wait_until("etcd", lambda: http_ok(f"{self.etcd_url}/health"), 20)

    def worker_argv(self, port: int) -> list[str]:
        return [self.args.bin, "run", "--nats-url", self.nats_url, "--etcd-endpoints", self.etcd_url,
                "--namespace", NS, "--mode", self.mode, "--metrics-addr", f"127.0.0.1:{port}",
                "--lease-ttl-secs", str(LEASE_TTL_S), "--set", f"jetstream.ack_wait_secs={WORKER_ACK_WAIT_S}",
                "--set", "jetstream.nak_delay_ms=200"]

    def start_worker(self, i: int) -> None:
        port = free_port()
        p = Proc(f"worker-{i + 1}", self.worker_argv(port), self.out,
                 {"RUST_LOG": "info", "NO_COLOR": "1"}).start()
        if i < len(self.workers):
            self.workers[i], self.worker_ports[i] = p, port
        else:
            self.workers.append(p)
            self.worker_ports.append(port)

    def workers_ready(self) -> bool:
        return all(http_ok(f"http://127.0.0.1:{p}/readyz") for p in self.worker_ports)

    def setup_jetstream(self) -> None:
        subprocess.run([self.args.bin, "setup", "--nats-url", self.nats_url, "--namespace", NS, "--mode",
                        "jetstream", "--set", f"jetstream.ack_wait_secs={WORKER_ACK_WAIT_S}",
                        "--set", "jetstream.nak_delay_ms=200"],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=HERE)

        # The decode engines' consumer, made before they start so its ack wait
        # is short: a killed decode engine's jobs go to the other one after it.
        async def consumer() -> None:
            import nats
            from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
            nc = await nats.connect(self.nats_url)
            await nc.jetstream().add_consumer(f"{NS.upper()}_GEN", ConsumerConfig(
                durable_name="decode", ack_policy=AckPolicy.EXPLICIT, deliver_policy=DeliverPolicy.ALL,
                ack_wait=DECODE_ACK_WAIT_S, max_ack_pending=1024))
            await nc.close()

        asyncio.run(consumer())

    # --- engines ---------------------------------------------------------------------
    def engine(self, kind: str, i: int, extra: list[str]) -> Proc:
        name = f"{kind}-{i + 1}"
        argv = [sys.executable, "-u", os.path.join(HERE, f"{kind}.py"), "--nats", self.nats_url, "--ns", NS,
                "--id", name, "--events", os.path.join(self.out, f"{name}.jsonl"), "--flow", self.flow,
                "--mode", self.mode] + extra
        if self.args.bug and BUG_OWNER.get(self.args.bug) == kind:
            argv += ["--bug", self.args.bug]
        return Proc(name, argv, self.out)

    def ready_count(self, name: str) -> int:
        path = os.path.join(self.out, f"{name}.jsonl")
        return sum(1 for e in events.read(path) if e["ev"] == "ready") if os.path.exists(path) else 0

    def start_decoder(self, i: int) -> None:
        p = self.engine("decode", i, []).start()
        if i < len(self.decoders):
            self.decoders[i] = p
        else:
            self.decoders.append(p)

    # --- faults ----------------------------------------------------------------------
    def schedule(self, rng: random.Random) -> list[tuple[float, str, int]]:
        kinds = ["worker_kill", "decode_kill", "etcd_stop"] + (["nats_restart"] if self.js else [])
        rounds = max(1, int(self.args.seconds // 60))
        n = rounds * len(kinds)
        first, last = 3.0, max(4.0, self.args.seconds - 10.0)
        slot = (last - first) / n
        plan = []
        k = 0
        for _ in range(rounds):
            order = kinds[:]
            rng.shuffle(order)
            for kind in order:
                plan.append((first + k * slot + rng.uniform(0, slot * 0.4), kind, rng.randrange(2)))
                k += 1
        return plan

    def inject(self, kind: str, target: int) -> None:
        t_start = events.now_ms()
        name = kind
        recovered = True
        try:
            name = self._inject(kind, target)
        except RuntimeError as e:  # a process did not come back
            recovered = False
            self.say(f"fault {kind}: {e}")
        t_end = events.now_ms()
        self.fault_log("fault", name=kind, target=name, t_start=t_start, t_end=t_end, recovered=recovered)
        self.say(f"fault {kind} ({name}) at {(t_start - self.t0) / 1000:.1f} s, "
                 + (f"recovered after {(t_end - t_start) / 1000:.1f} s" if recovered else "NOT RECOVERED"))

    def _inject(self, kind: str, target: int) -> str:
        name = kind
        if kind == "worker_kill":
            name = self.workers[target].name
            self.workers[target].stop(signal.SIGKILL)
            time.sleep(0.5)
            self.start_worker(target)
            wait_until("the restarted worker", self.workers_ready, 20)
        elif kind == "decode_kill":
            name = self.decoders[target].name
            before = self.ready_count(name)
            self.decoders[target].stop(signal.SIGKILL)
            time.sleep(1.0)
            self.start_decoder(target)
            wait_until("the restarted decode engine", lambda: self.ready_count(name) > before, 20)
        elif kind == "nats_restart":
            name = "nats-server"
            self.nats.stop(signal.SIGTERM)
            self.start_nats()
            wait_until("the workers after the NATS restart", self.workers_ready, 20)
        elif kind == "etcd_stop":
            name = "etcd"
            self.etcd.stop(signal.SIGTERM)
            time.sleep(LEASE_TTL_S + 2)
            self.start_etcd()
            wait_until("the workers after the etcd restart", self.workers_ready, 30)
        return name

    # --- the run ---------------------------------------------------------------------
    def run(self) -> int:
        a = self.args
        self.start_nats()
        self.start_etcd()
        if self.js:
            self.setup_jetstream()
        for i in range(2):
            self.start_worker(i)
        wait_until("the workers (/readyz)", self.workers_ready, 60)
        for i in range(2):
            self.prefills.append(self.engine("prefill", i, ["--hold-ms", str(a.hold_ms)]).start())
            self.start_decoder(i)
        for p in self.prefills + self.decoders:
            wait_until(f"{p.name} ready", lambda p=p: self.ready_count(p.name) > 0, 20)
        count = max(1, int(a.rate * a.seconds))
        self.t0 = events.now_ms()
        rng = random.Random(self.seed)
        plan = self.schedule(rng) if a.faults else []
        answer_timeout = 15.0
        with open(os.path.join(self.out, "run.json"), "w") as f:
            json.dump({"flow": self.flow, "mode": self.mode, "seed": self.seed, "seconds": a.seconds,
                       "rate": a.rate, "hold_ms": a.hold_ms, "faults": a.faults, "bug": a.bug, "t0": self.t0,
                       "pre_ms": 2000, "post_ms": 3000, "answer_timeout_s": answer_timeout}, f)
        self.say(f"{count} requests at {a.rate}/s; seed {self.seed}; logs in {self.out}")
        frontend = self.engine("frontend", 0, ["--count", str(count), "--rate", str(a.rate), "--seed",
                                               str(self.seed), "--run", f"{self.flow[0]}{self.seed}",
                                               "--answer-timeout", str(answer_timeout)])
        frontend.name = "frontend"
        frontend.start()
        hard_end = time.monotonic() + a.seconds + answer_timeout + 60
        while frontend.alive() and time.monotonic() < hard_end:
            if plan and events.now_ms() - self.t0 >= plan[0][0] * 1000:
                _, kind, target = plan.pop(0)
                self.inject(kind, target)
            time.sleep(0.05)
        if frontend.alive():
            self.say("the frontend did not finish in time")
            frontend.stop(signal.SIGKILL)
        # Blocks still held now come free with their hold; then the prefill
        # engines say what they still hold.
        time.sleep(a.hold_ms / 1000 + 1.0)
        return 0

    def shutdown(self) -> None:
        for p in self.prefills + self.decoders:
            p.stop(signal.SIGTERM, 5)
        for p in self.workers:
            p.stop(signal.SIGTERM, 15)
        for p in (getattr(self, "etcd", None), getattr(self, "nats", None)):
            if p is not None:
                p.stop(signal.SIGTERM, 10)


def run_flow(flow: str, args: Any, out_dir: str, seed: int) -> int:
    os.makedirs(out_dir, exist_ok=True)
    system = System(flow, args, out_dir, seed)
    try:
        system.run()
    finally:
        system.shutdown()
        # The servers' data (etcd preallocates 64 MB) is of no use after the
        # run; the event logs and process logs stay.
        for data in ("etcd", "jetstream"):
            shutil.rmtree(os.path.join(out_dir, data), ignore_errors=True)
    ok, table = checker.report(out_dir)
    print(f"\n== {flow} flow ({system.mode} mode), seed {seed}: {'all invariants held' if ok else 'BROKEN'}")
    print(table, flush=True)
    return 0 if ok else 1


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--flow", choices=["vllm", "trtllm", "both"], default="both")
    p.add_argument("--faults", action="store_true")
    p.add_argument("--seconds", type=float, default=30)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--rate", type=float, default=20, help="requests per second")
    p.add_argument("--hold-ms", type=int, default=4000, help="the prefill engines' KV hold")
    p.add_argument("--bug", choices=sorted(BUG_OWNER), default="", help="a deliberately broken engine")
    p.add_argument("--out", default=None, help="run directory (default: a new one under /tmp, kept)")
    p.add_argument("--bin", default=os.path.join(ROOT, "target", "debug", "prefill-handoff"))
    p.add_argument("--nats-server", default="/usr/sbin/nats-server" if os.path.exists("/usr/sbin/nats-server")
                   else (shutil.which("nats-server") or "nats-server"))
    p.add_argument("--etcd", default=shutil.which("etcd") or "etcd")
    args = p.parse_args()
    args.bin = os.path.abspath(args.bin)  # the processes run in this directory
    if not os.access(args.bin, os.X_OK):
        print(f"serving: no prefill-handoff binary at {args.bin} (cargo build --bin prefill-handoff)", file=sys.stderr)
        return 2
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1, 1_000_000)
    print(f"serving: seed {seed} (rerun with --seed {seed})", flush=True)
    out = args.out or tempfile.mkdtemp(prefix="serving.")
    flows = ["vllm", "trtllm"] if args.flow == "both" else [args.flow]
    rc = 0
    for flow in flows:
        rc |= run_flow(flow, args, os.path.join(out, flow), seed)
    print(f"serving: {'OK' if rc == 0 else 'FAILED'}; logs in {out}", flush=True)
    return rc


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    sys.exit(main())
