"""latest.png: tokens/s and TTFT against clients. Standard library and matplotlib only, so that the peer
venv's Python (which has matplotlib) can draw it: `run_benchmarks.py --plot-only JSON PNG`."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from .plan import BENCH_DIR, CLIENT_LEVELS


def render_plot(results: dict[str, Any], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig, (tps, ttft) = plt.subplots(1, 2, figsize=(11, 4.2))
    raw = results["raw"]["batches"]
    tps.plot([b["batch"] for b in raw], [b["decode_tokens_per_s"] for b in raw], "k--o",
             label="raw loop, decode steps only")
    tps.plot([b["batch"] for b in raw], [b["end_to_end_tokens_per_s"] for b in raw], "k-o",
             label="raw loop end-to-end (prefill + 64)")
    for name, style in (("ours", {"color": "C0", "marker": "o"}), ("peer", {"color": "C3", "marker": "s"})):
        levels = (results.get(name) or {}).get("levels", [])
        if not levels:
            continue
        clients = [lv["concurrency"] for lv in levels]
        tps.plot(clients, [lv["aggregate_tokens_per_s"] for lv in levels], **style, label=f"{name} aggregate")
        tps.plot(clients, [lv["stream_tokens_per_s_median"] or 0 for lv in levels], **style, alpha=0.5,
                 linestyle=":", label=f"{name} per stream (p50)")
        ttft.plot(clients, [(lv["ttft_median_s"] or 0) * 1000 for lv in levels], **style, label=f"{name} p50")
        ttft.plot(clients, [(lv["ttft_p95_s"] or 0) * 1000 for lv in levels], **style, alpha=0.5, linestyle=":",
                  label=f"{name} p95")
    tps.set(title="Throughput", xlabel="concurrent clients (raw: batch size)", ylabel="tokens/s",
            xticks=list(CLIENT_LEVELS))
    ttft.set(title="Time to first token", xlabel="concurrent clients", ylabel="ms", yscale="log",
             xticks=list(CLIENT_LEVELS))
    ttft.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    for axis in (tps, ttft):
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    meta = results["meta"]
    fig.suptitle(f"{meta['model']} · {meta['threads']} threads · {meta['date']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)


def plot(json_path: Path, png_path: Path) -> None:
    """Renders here when matplotlib is importable, else with the peer venv's Python."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        from .processes import ensure_peer_venv  # not at the top: it imports edge_llm, which the peer venv lacks

        python = ensure_peer_venv()
        subprocess.run([str(python), str(BENCH_DIR / "run_benchmarks.py"), "--plot-only", str(json_path),
                        str(png_path)], check=True)
        return
    render_plot(json.loads(json_path.read_text()), png_path)
