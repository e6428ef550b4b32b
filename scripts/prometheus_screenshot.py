"""Take docs/img/prometheus.png: Prometheus's graph page, in headless Chromium, while a real ``edgeinfer serve``
(all-MiniLM-L6-v2, onnxruntime) is under load and Prometheus scrapes it every second.

    python scripts/prometheus_screenshot.py [--seconds 90] [--out docs/img/prometheus.png]

Needs ``prometheus`` and ``chromium`` on PATH (Debian: apt-get install prometheus chromium). The load steps from
1 to 4 to 8 clients; the graph shows the request rate Prometheus computes from the scraped counter.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlencode

# one graph: with two, headless Chromium draws the scrolled page wrongly
QUERY = 'sum by (endpoint, status) (rate(edgeinfer_requests_total{endpoint="/v1/embeddings"}[5s]))'


def graph_url(base: str, range_s: int) -> str:
    return f"{base}/graph?" + urlencode({"g0.expr": QUERY, "g0.tab": "0", "g0.range_input": f"{range_s}s"})


def screenshot(url: str, out: Path) -> None:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        sys.exit("chromium not found: apt-get install chromium")
    cmd = [exe, "--headless", "--disable-gpu", "--hide-scrollbars", "--timeout=8000",
           f"--screenshot={out}", "--window-size=1280,800", url]
    if os.geteuid() == 0:
        cmd.insert(1, "--no-sandbox")  # Chromium refuses to run its sandbox as root
    subprocess.run(cmd, check=True, capture_output=True, timeout=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=90.0)
    ap.add_argument("--out", type=Path, default=Path("docs/img/prometheus.png"))
    args = ap.parse_args()

    from edgeinfer.testing import prometheus
    from edgeinfer.testing.fixtures import _cached_export
    from edgeinfer.testing.serve import ServerProc, minilm_bundle

    tmp = Path(tempfile.mkdtemp(prefix="edgeinfer-prom-shot-"))
    bundle = minilm_bundle(_cached_export("minilm-dynamic", None, None), tmp / "minilm-ort", "onnxruntime")
    with ServerProc([bundle], log=tmp / "server.log") as server, \
            prometheus.PrometheusProc([f"127.0.0.1:{server.port}"], tmp / "prom") as prom:
        prom.wait_value('up{job="edgeinfer"}', lambda v: v == 1)
        loads = []
        for clients in (1, 3, 4):  # 1, then 4, then 8 clients in all
            loads.append(prometheus.EmbeddingLoad(server.url, clients).start())
            time.sleep(args.seconds / 3)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        screenshot(graph_url(prom.url, int(args.seconds) + 10), args.out)  # still under load
        for load in loads:
            load.stop()
        done = sum(len(load.statuses) for load in loads)
        ok = sum(load.statuses.count(200) for load in loads)
    print(f"{args.out}: {args.out.stat().st_size // 1024} KiB; {done} requests ({ok} answered 200) "
          f"in {args.seconds:g} s")


if __name__ == "__main__":
    main()
