"""free_port (edge_llm.testing.server): test processes running side by side (pytest-xdist workers) never get the same
port, and no port comes from the kernel's ephemeral range, where an outgoing connection could take it before the
server binds."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

from edge_llm.testing.server import PORTS, free_port

# Claims three ports, prints them, and holds them until its stdin closes.
HOLDER = """
import sys
from edge_llm.testing.server import free_port
print(*[free_port() for _ in range(3)], flush=True)
sys.stdin.read()
"""


def test_a_port_is_free_unclaimed_by_this_process_before_and_outside_the_ephemeral_range() -> None:
    ports = [free_port() for _ in range(5)]
    assert len(set(ports)) == 5
    assert all(port in PORTS for port in ports)
    low, _high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    assert max(ports) < low
    for port in ports:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


def test_another_process_never_gets_a_port_one_process_holds() -> None:
    """Two fresh processes: both would try the same ports first."""
    holder = subprocess.Popen([sys.executable, "-c", HOLDER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout is not None
        held = {int(port) for port in holder.stdout.readline().split()}
        assert len(held) == 3 and held <= set(PORTS)
        other = subprocess.run([sys.executable, "-c", HOLDER], input="", capture_output=True, text=True, timeout=60)
        assert other.returncode == 0, other.stderr
        given = {int(port) for port in other.stdout.split()}
        assert len(given) == 3 and not given & held
    finally:
        holder.communicate("", timeout=30)


def test_a_port_something_listens_on_is_stepped_over() -> None:
    given = free_port()
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", given + 1))  # the next port free_port would try
        listener.listen()
        assert free_port() != given + 1
