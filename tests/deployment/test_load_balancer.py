"""nginx (Debian's package) running deploy/nginx/edge-llm.conf as shipped in front of three real `edge-llm serve`
replicas on loopback: session hashing keeps each conversation's prefix-cache hits, a rolling restart fails no
request, and a killed replica fails its own streams only. docs/deployment.md reports the figures.

Without nginx these tests fail (a balancer test that does not run shows nothing) with the line that says how to
install it; scripts/bootstrap.sh test installs it."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import socket
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from edge_llm.testing.server import RunningServer, environment, free_port, serve_command, stop, wait_ready
from tests.helpers import SMALL_MODEL_CHAT, chat_body, metric, scrape, small_model, sse_events, wait_for

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "deploy" / "nginx" / "edge-llm.conf"
NGINX = Path(os.environ.get("EDGE_LLM_TEST_NGINX") or "/usr/sbin/nginx")
ARTIFACTS = REPO / "test-artifacts"
CHAT = "/v1/chat/completions"
# Small replicas: the small model (what is tested is routing and caching, not the answers), one thread each (three
# share the machine), a small context; four sequences, so however the balancer spreads the kill test's four streams,
# each of them runs at once.
REPLICA_FLAGS = ("--parallel", "4", "--ctx-size", "4096", "--drain-timeout", "60", *SMALL_MODEL_CHAT)
TIMEOUT = 300


def require_nginx() -> None:
    if not NGINX.is_file():
        pytest.fail(f"{NGINX} is missing, so the load balancer cannot be tested: run `scripts/bootstrap.sh test` "
                    "as root (it installs it), or: sudo apt-get install -y --no-install-recommends nginx",
                    pytrace=False)


# ---- replicas and the balancer ---------------------------------------------------------------------------


class Replica:
    """One `edge-llm serve` on a port of its own that it keeps across restarts."""

    def __init__(self, log_dir: Path, index: int) -> None:
        self.log_dir = log_dir
        self.index = index
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.starts = 0
        self.server: RunningServer | None = None

    def start(self) -> None:
        self.starts += 1
        log_path = self.log_dir / f"replica-{self.index}-start-{self.starts}.log"
        with log_path.open("wb") as log:
            process = subprocess.Popen(serve_command(self.port, *REPLICA_FLAGS, model=small_model(), threads=1), stdout=log,
                                       stderr=subprocess.STDOUT, env=environment(None))
        self.server = RunningServer(f"http://{self.address}", process, log_path)

    @property
    def process(self) -> subprocess.Popen[bytes]:
        assert self.server is not None
        return self.server.process

    def wait_ready(self) -> None:
        assert self.server is not None
        wait_ready(self.server, timeout=TIMEOUT)

    def running(self) -> float:
        assert self.server is not None
        return metric(scrape(self.server), "vllm:num_requests_running",
                      model_name=small_model().name.removesuffix(".gguf"), engine="0")

    def chats_served(self) -> float:
        assert self.server is not None
        return metric(scrape(self.server), "edge_llm_http_requests_total", route=CHAT, method="POST", status="200")


@dataclass
class Balancer:
    url: str
    access_log: Path

    def upstreams(self, request_ids: list[str]) -> dict[str, str]:
        """request id → the replica(s) nginx sent it to, from the access log. nginx writes a request's line after its
        last byte went out, so a client that has read a whole answer may be ahead of it: this waits for the lines of
        `request_ids`."""
        pattern = re.compile(r"upstream=(?P<upstream>.*?) upstream_status=.*? request_id=(?P<id>\S+) session=")
        logged: dict[str, str] = {}

        def all_logged() -> bool:
            logged.update((found["id"], found["upstream"])
                          for found in map(pattern.search, self.access_log.read_text().splitlines()) if found)
            return all(request_id in logged for request_id in request_ids)

        wait_for(all_logged, TIMEOUT, f"nginx's access-log lines of {request_ids}")
        return logged


def balancer_config(addresses: list[str], port: int, access_log: Path) -> str:
    """deploy/nginx/edge-llm.conf with the test's replicas, listen port and log path: nothing else changes."""
    text = CONFIG.read_text()
    servers = re.findall(r"^( +)server \d+\.\d+\.\d+\.\d+:\d+( [^;]*);\n", text, re.MULTILINE)
    assert len(servers) >= 2 and len(set(servers)) == 1, servers
    indent, options = servers[0]
    ours = "".join(f"{indent}server {address}{options};\n" for address in addresses)
    text, count = re.subn(r"(?:^ +server \d+\.\d+\.\d+\.\d+:\d+ [^;]*;\n)+", lambda _: ours, text,
                          flags=re.MULTILINE)
    assert count == 1
    for pattern, replacement in ((r"listen 80;", f"listen 127.0.0.1:{port};"),
                                 (r"access_log \S+ edge_llm;", f"access_log {access_log} edge_llm;")):
        text, count = re.subn(pattern, replacement, text)
        assert count == 1, pattern
    return text


def nginx_command(work: Path, addresses: list[str], port: int) -> list[str]:
    """Writes a main nginx.conf in `work` that includes the balancer config; returns the command running it."""
    (work / "edge-llm.conf").write_text(balancer_config(addresses, port, work / "edge-llm.access.log"))
    temp = "\n".join(f"    {name}_temp_path {work / name};" for name in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    (work / "nginx.conf").write_text(
        ("user root;\n" if os.geteuid() == 0 else "")  # workers must reach pytest's private temporary folder
        + f"daemon off;\nworker_processes 1;\npid {work / 'nginx.pid'};\nevents {{ worker_connections 512; }}\n"
        f"http {{\n    access_log {work / 'other.access.log'};\n{temp}\n    include {work / 'edge-llm.conf'};\n}}\n")
    return [str(NGINX), "-p", str(work), "-c", str(work / "nginx.conf"), "-e", str(work / "error.log")]


def listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


@contextmanager
def run_nginx(work: Path, replicas: list[Replica]) -> Iterator[Balancer]:
    port = free_port()
    command = nginx_command(work, [replica.address for replica in replicas], port)
    with (work / "nginx.out").open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: process.poll() is not None or listening(port), 60, "nginx to listen")
        assert process.poll() is None, (work / "nginx.out").read_text() + (work / "error.log").read_text()
        yield Balancer(f"http://127.0.0.1:{port}", work / "edge-llm.access.log")
    finally:
        process.terminate()
        process.wait(30)


def test_nginx_accepts_the_shipped_config(tmp_path: Path) -> None:
    require_nginx()
    command = nginx_command(tmp_path, ["127.0.0.1:3001", "127.0.0.1:3002"], free_port())
    result = subprocess.run([*command, "-t"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Replica]]:
    require_nginx()
    small_model()  # fetched before the replicas start
    log_dir = tmp_path_factory.mktemp("replicas")
    started = [Replica(log_dir, index) for index in range(3)]
    try:
        for replica in started:  # loading side by side
            replica.start()
        for replica in started:
            replica.wait_ready()
        yield started
    finally:
        for replica in started:
            if replica.server is not None:
                stop(replica.process)


@pytest.fixture(scope="module")
def balancer(replicas: list[Replica], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Balancer]:
    with run_nginx(tmp_path_factory.mktemp("nginx"), replicas) as running:
        yield running


@pytest.fixture
def pool(replicas: list[Replica], balancer: Balancer) -> list[Replica]:
    """Every replica up and ready (a test before may have stopped one)."""
    for replica in replicas:
        if replica.process.poll() is not None:
            replica.start()
    for replica in replicas:
        replica.wait_ready()
    return replicas


# ---- clients ---------------------------------------------------------------------------------------------


@dataclass
class Outcome:
    request_id: str
    ok: bool
    detail: str = ""


def stream_chat(url: str, body: dict[str, Any], request_id: str, started: threading.Event | None = None) -> Outcome:
    """One streamed chat: ok when it answered 200 and ended normally (finish_reason, then [DONE])."""
    try:
        with httpx.stream("POST", url + CHAT, json={**body, "stream": True}, headers={"X-Request-Id": request_id},
                          timeout=TIMEOUT) as response:
            if response.status_code != 200:
                return Outcome(request_id, False, f"status {response.status_code}: {response.read()[:300]!r}")
            finish, done = None, False
            for _, data in sse_events(response):
                if data == "[DONE]":
                    done = True
                    continue
                chunk = json.loads(data)
                if "error" in chunk:
                    return Outcome(request_id, False, data)
                if started is not None:
                    started.set()
                finish = next((choice["finish_reason"] for choice in chunk["choices"] if choice["finish_reason"]),
                              finish)
            return Outcome(request_id, done and finish in ("stop", "length"), f"finish {finish}, done {done}")
    except httpx.HTTPError as error:
        return Outcome(request_id, False, f"{type(error).__name__}: {error}")


class Load:
    """`clients` threads, each streaming one short chat after another through the balancer until stop()."""

    def __init__(self, url: str, clients: int) -> None:
        self.url = url
        self.outcomes: list[Outcome] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._client, args=(n,), daemon=True) for n in range(clients)]
        for thread in self._threads:
            thread.start()

    def _client(self, n: int) -> None:
        turn = 0
        while not self._stop.is_set():
            turn += 1
            outcome = stream_chat(self.url, chat_body(f"Client {n}, request {turn}: name a fruit.", max_tokens=12),
                                  f"load-{n}-{turn}")
            with self._lock:
                self.outcomes.append(outcome)

    def completed(self) -> int:
        with self._lock:
            return len(self.outcomes)

    def failures(self) -> list[Outcome]:
        with self._lock:
            return [outcome for outcome in self.outcomes if not outcome.ok]

    def stop(self) -> list[Outcome]:
        self._stop.set()
        for thread in self._threads:
            thread.join(TIMEOUT)
        assert not any(thread.is_alive() for thread in self._threads), "a client did not finish"
        return self.outcomes


class Stream(threading.Thread):
    """A long streamed chat on a thread; `started` is set once its first token arrived."""

    def __init__(self, url: str, request_id: str) -> None:
        super().__init__(daemon=True)
        self.url, self.request_id = url, request_id
        self.started = threading.Event()
        self.outcome: Outcome | None = None
        self.start()

    def run(self) -> None:
        body = chat_body("Write the numbers from 1 to 500, separated by commas.", max_tokens=100)
        try:
            self.outcome = stream_chat(self.url, body, self.request_id, self.started)
        finally:
            self.started.set()

    def result(self) -> Outcome:
        self.join(TIMEOUT)
        assert self.outcome is not None, "the stream did not end"
        return self.outcome


# ---- prefix affinity -------------------------------------------------------------------------------------

SESSIONS = 4  # each first turn, and most turns without affinity, prefill a whole system prompt: keep it short
WORDS = ("river stone lantern orbit meadow cipher harbor quartz willow ember falcon prism tundra velvet anchor "
         "glacier thistle beacon canyon saffron").split()


def system_prompt(session: str) -> str:
    """A system prompt of this session's own (no two sessions share more than the chat template's start)."""
    rng = random.Random(session)
    return f"Session {session}. Keep these notes in mind: " + " ".join(rng.choice(WORDS) for _ in range(80))


def follow_up_turns(balancer: Balancer, sessions: list[str], turns: int, *, sticky: bool) -> tuple[float, int]:
    """Multi-turn chats, turn by turn in a shuffled order of sessions. Returns, over the turns after the first (a
    first turn has nothing of its own to find in any cache), cached / prompt tokens and how many of them found less
    than their session's previous turn (its whole prompt is in the cache of the replica that answered it)."""
    rng = random.Random(7)
    histories = {session: [{"role": "system", "content": system_prompt(session)}] for session in sessions}
    previous: dict[str, int] = {}
    prompt = cached = missed = 0
    for turn in range(turns):
        for session in rng.sample(sessions, len(sessions)):
            history = histories[session]
            history.append({"role": "user", "content": f"Question {turn + 1}: one word for a colour?"})
            headers = {"X-Session-Id": session} if sticky else {}
            response = httpx.post(balancer.url + CHAT, headers=headers, timeout=TIMEOUT,
                                  json={"messages": history, "max_tokens": 6, "temperature": 0})
            assert response.status_code == 200, response.text
            answer = response.json()
            history.append({"role": "assistant", "content": answer["choices"][0]["message"]["content"]})
            usage = answer["usage"]
            if turn > 0:
                prompt += usage["prompt_tokens"]
                cached += usage["prompt_tokens_details"]["cached_tokens"]
                missed += usage["prompt_tokens_details"]["cached_tokens"] < previous[session]
            previous[session] = usage["prompt_tokens"]
    return cached / prompt, missed


def test_session_hashing_keeps_conversations_on_their_prefix_cache(pool: list[Replica], balancer: Balancer) -> None:
    hashed, hashed_missed = follow_up_turns(balancer, [f"hashed-{n}" for n in range(SESSIONS)], 3, sticky=True)
    spread, spread_missed = follow_up_turns(balancer, [f"spread-{n}" for n in range(SESSIONS)], 3, sticky=False)
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / "load-balancer-prefix-affinity.json").write_text(
        json.dumps({"replicas": len(pool), "sessions": SESSIONS, "turns": 3, "hashed_hit_ratio": round(hashed, 3),
                    "spread_hit_ratio": round(spread, 3), "hashed_missed_turns": hashed_missed,
                    "spread_missed_turns": spread_missed}) + "\n")
    print(f"prefix-cache hit ratio of follow-up turns: hashed on X-Session-Id {hashed:.3f}, spread without it {spread:.3f}")
    # Every hashed follow-up found its whole previous turn; without the header some went to another replica.
    assert hashed_missed == 0, (hashed, hashed_missed)
    assert spread_missed >= 1 and hashed > spread, (spread, spread_missed)


# ---- rolling restart and a killed replica ----------------------------------------------------------------


def test_rolling_restart_under_streaming_load_fails_no_request(pool: list[Replica], balancer: Balancer) -> None:
    victim = pool[0]
    load = Load(balancer.url, clients=4)
    try:
        # SIGTERM while the replica is streaming: its streams must finish, its new work go elsewhere.
        wait_for(lambda: victim.running() >= 1 or bool(load.failures()), TIMEOUT, "a stream on the replica")
        assert not load.failures()
        victim.process.send_signal(signal.SIGTERM)
        assert victim.process.wait(TIMEOUT) == 0, victim.server.log() if victim.server else ""
        victim.start()
        victim.wait_ready()
        wait_for(lambda: victim.chats_served() >= 1, TIMEOUT, "the restarted replica to get requests")
        served = load.completed()
        wait_for(lambda: load.completed() >= served + 4, TIMEOUT, "more requests after the restart")
    finally:
        outcomes = load.stop()
    failed = [outcome for outcome in outcomes if not outcome.ok]
    assert not failed, f"{len(failed)} of {len(outcomes)} failed: {failed[:5]}"
    assert "drained; exiting" in (victim.log_dir / f"replica-{victim.index}-start-{victim.starts - 1}.log").read_text()


def test_a_killed_replica_fails_only_its_own_streams(pool: list[Replica], balancer: Balancer) -> None:
    streams = [Stream(balancer.url, f"kill-{n}") for n in range(4)]
    wait_for(lambda: all(stream.started.is_set() for stream in streams), TIMEOUT, "every stream's first token")
    running = {replica.address: replica.running() for replica in pool}
    victim = max(pool, key=lambda replica: running[replica.address])
    assert running[victim.address] >= 1, running
    victim.process.kill()
    victim.process.wait()
    after = [stream_chat(balancer.url, chat_body(f"After the kill, {n}: name a colour.", max_tokens=4),
                         f"after-kill-{n}") for n in range(6)]
    assert all(outcome.ok for outcome in after), after
    outcomes = [stream.result() for stream in streams]
    upstreams = balancer.upstreams([outcome.request_id for outcome in outcomes])
    on_victim = [outcome for outcome in outcomes if upstreams[outcome.request_id] == victim.address]
    elsewhere = [outcome for outcome in outcomes if upstreams[outcome.request_id] != victim.address]
    assert on_victim and not any(outcome.ok for outcome in on_victim), (on_victim, running)  # all in flight
    assert all(outcome.ok for outcome in elsewhere), elsewhere
