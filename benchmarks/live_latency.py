"""How long a message posted to the API takes to reach the viewers' websockets, in both modes.

    .venv/bin/python benchmarks/live_latency.py [--posts 40] [--viewers 1 50] [--modes embedded scaled]

For each mode it starts its own servers on free 127.0.0.1 ports and stops them:

* embedded: one daphne process, SQLite, the in-memory channel layer;
* scaled: two daphne processes on a fresh PostgreSQL database and the local
  Redis (channel layer and broker); messages are posted to process 1 and the
  viewers are connected to process 2, so every event crosses Redis.

A viewer is a websocket on the session's group (the probe route of
``tests/liveprobe.py``: the same group and events as the dashboard page,
without rendering). Each post appends one message; the latency is from just
before the POST is sent to the arrival, at each viewer, of the ``gauge.update``
that reports it. Posts are spaced beyond the 100 ms coalescing interval, so
each one measures a first, undelayed update. Prints p50/p95/max per mode and
number of viewers. The viewers run in processes of their own (25 sockets
each), apart from the posting client; all of it shares the machine's cores
with the servers, so the figures include that contention.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import httpx2  # noqa: E402
from websockets.asyncio.client import connect  # noqa: E402

from tests.scaled.deployment import Deployment, Unavailable, ws_url  # noqa: E402

WARMUP_POSTS = 5
# Longer than the coalescing interval (contextlab.support.live.COALESCE_SECONDS). The
# page renders before it pushes, so posts closer than a render would merge.
GAP_SECONDS = {"probe": 0.15, "page": 0.3}
# After the last post: how long the viewers wait for stragglers.
ARRIVAL_TIMEOUT = 2.0
VIEWERS_PER_PROCESS = 25
PROBE_APP = "tests.liveprobe:application"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def _viewer_process(ws: str, viewers: int, headers: dict[str, str], ready: Any, stop: Any, results: Any) -> None:
    """A process holding ``viewers`` websockets; sends back the arrival times of what they received.

    Probe viewers: {message count of the gauge.update: [times]}. Page viewers
    (HTML fragments, no count in them): {-1: [times of every push]}.
    """

    async def main() -> dict[int, list[float]]:
        arrivals: dict[int, list[float]] = {}
        sockets = [await connect(ws, open_timeout=30, max_queue=None, additional_headers=headers)
                   for _ in range(viewers)]

        async def read(socket: Any) -> None:
            async for raw in socket:
                arrived = time.time()
                if raw.startswith("{"):
                    event = json.loads(raw)
                    if event.get("type") == "gauge.update":
                        arrivals.setdefault(int(event["state"]["messages"]), []).append(arrived)
                elif 'id="gauge' in raw:
                    arrivals.setdefault(-1, []).append(arrived)

        readers = [asyncio.create_task(read(s)) for s in sockets]
        ready.set()
        while not stop.is_set():
            await asyncio.sleep(0.05)
        for task in readers:
            task.cancel()
        for socket in sockets:
            await socket.close()
        return arrivals

    results.put(asyncio.run(main()))


def measure(post_base: str, ws: str, token: str, session_id: str, viewers: int, posts: int, *,
            headers: dict[str, str], gap: float) -> dict[str, Any]:
    # Viewers live in processes of their own (at most VIEWERS_PER_PROCESS each),
    # so reading 50 sockets does not hold up the posting client, and the work
    # of reading them is spread over the cores like separate browsers would.
    context = multiprocessing.get_context("spawn")
    ready = [context.Event() for _ in range(0, viewers, VIEWERS_PER_PROCESS)]
    stop = context.Event()
    results = context.Queue()
    shares = [min(VIEWERS_PER_PROCESS, viewers - i) for i in range(0, viewers, VIEWERS_PER_PROCESS)]
    processes = [context.Process(target=_viewer_process, args=(ws, share, headers, event, stop, results))
                 for share, event in zip(shares, ready, strict=True)]
    for process in processes:
        process.start()
    try:
        for event in ready:
            if not event.wait(60):
                raise RuntimeError("the viewers could not connect")
        started: dict[int, float] = {}
        post_times: list[float] = []
        with httpx2.Client(base_url=post_base, headers={"Authorization": f"Bearer {token}"}, timeout=30) as client:
            base = int(client.get(f"/api/v1/sessions/{session_id}").json()["messages"])
            for n in range(WARMUP_POSTS + posts):
                count = base + n + 1
                began = time.time()
                response = client.post(f"/api/v1/sessions/{session_id}/messages", json={
                    "messages": [{"role": "user", "content": f"latency probe {n}: is the build green?"}]})
                if response.status_code != 201:
                    raise RuntimeError(f"POST answered {response.status_code}: {response.text}")
                if n >= WARMUP_POSTS:
                    started[count] = began
                    post_times.append((time.time() - began) * 1000)
                time.sleep(gap)
        time.sleep(ARRIVAL_TIMEOUT)
    finally:
        stop.set()
    arrivals: dict[int, list[float]] = {}
    for _ in processes:
        for count, times in results.get(timeout=60).items():
            arrivals.setdefault(count, []).extend(times)
    for process in processes:
        process.join(timeout=30)
    if -1 in arrivals:
        # Page pushes: a viewer's first gauge push after a post (and before the next one) is that post's.
        pushes = sorted(arrivals[-1])
        starts = sorted(started.values())
        latencies: list[float] = []
        for index, began in enumerate(starts):
            until = starts[index + 1] if index + 1 < len(starts) else float("inf")
            got = [t for t in pushes if began <= t < until]
            latencies.extend((t - began) * 1000 for t in got[:viewers])
    else:
        latencies = [(t - began) * 1000 for count, began in started.items() for t in arrivals.get(count, [])]
    missed = viewers * len(started) - len(latencies)
    return {
        "viewers": viewers, "posts": posts, "samples": len(latencies), "missed": missed,
        "p50": statistics.median(latencies) if latencies else float("nan"),
        "p95": percentile(latencies, 0.95) if latencies else float("nan"),
        "max": max(latencies) if latencies else float("nan"),
        "post_p50": statistics.median(post_times) if post_times else float("nan"),
    }


def _page_login(deployment: Deployment) -> str:
    """A logged-in browser's session cookie for "alice", made the way the login form makes one."""
    return str(deployment.python(
        "import json\n"
        "from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY\n"
        "from django.contrib.auth.models import User\n"
        "from django.contrib.sessions.backends.db import SessionStore\n"
        "user = User.objects.get(username='alice')\n"
        "store = SessionStore()\n"
        "store[SESSION_KEY] = str(user.pk)\n"
        "store[BACKEND_SESSION_KEY] = 'django.contrib.auth.backends.ModelBackend'\n"
        "store[HASH_SESSION_KEY] = user.get_session_auth_hash()\n"
        "store.create()\n"
        "print(json.dumps(store.session_key))"))


def run_mode(mode: str, viewer_counts: list[int], posts: int, viewer_kind: str,
             app: str = PROBE_APP, repeat: int = 1) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory(prefix=f"contextlab-latency-{mode}-") as folder:
        deployment = Deployment(Path(folder), mode=mode)
        try:
            deployment.create()
            poster = deployment.start_web("web1", app=app)
            viewer_process = deployment.start_web("web2", app=app) if mode == "scaled" else poster
            token = deployment.api_token()
            session = httpx2.post(f"{poster.url}/api/v1/sessions", json={"system_prompt": "You are a coding agent."},
                                  headers={"Authorization": f"Bearer {token}"}, timeout=30).json()
            results = []
            ws = ws_url(viewer_process, session["id"])
            headers: dict[str, str] = {}
            if viewer_kind == "page":
                # The session page's own websocket: logged in, and it renders the fragments.
                ws = viewer_process.url.replace("http://", "ws://") + f"/ws/sessions/{session['id']}/"
                headers = {"Cookie": f"sessionid={_page_login(deployment)}", "Origin": viewer_process.url}
            for _ in range(repeat):
                for viewers in viewer_counts:
                    result = measure(poster.url, ws, token, session["id"], viewers, posts, headers=headers,
                                     gap=GAP_SECONDS[viewer_kind])
                    results.append({"mode": f"{mode}/{viewer_kind}", **result})
                    print_row(results[-1])
            return results
        finally:
            deployment.destroy()


def print_row(row: dict[str, Any]) -> None:
    print(f"{row['mode']:<15} {row['viewers']:>7} {row['samples']:>7} {row['missed']:>6} "
          f"{row['p50']:>8.1f} {row['p95']:>8.1f} {row['max']:>8.1f} {row['post_p50']:>9.1f}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--posts", type=int, default=40, help="measured posts per configuration (default 40)")
    parser.add_argument("--viewers", type=int, nargs="+", default=[1, 50])
    parser.add_argument("--modes", nargs="+", choices=["embedded", "scaled"], default=["embedded", "scaled"])
    parser.add_argument("--viewer", nargs="+", choices=["probe", "page"], default=["probe", "page"],
                        help="probe: the events as published; page: the session page's websocket, which "
                             "renders the gauge and the other fragments (default: both)")
    parser.add_argument("--repeat", type=int, default=1,
                        help="measure each configuration this many times; the best p95 is summed up at the end "
                             "(other work on the machine only ever adds latency)")
    parser.add_argument("--app", default=PROBE_APP,
                        help="the ASGI application the web processes serve; it must route /probe/ like "
                             f"{PROBE_APP} for probe viewers (default: that one)")
    options = parser.parse_args(argv)
    if not 1 <= options.posts <= 500 or not all(1 <= v <= 200 for v in options.viewers) \
            or not 1 <= options.repeat <= 5:
        parser.error("--posts must be 1-500, --viewers 1-200 and --repeat 1-5 (the run stays short)")
    # Other work on the machine shows in the tails: say how busy it was.
    print(f"load average at start: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    print("latency from POST /messages to the gauge.update on each viewer's websocket, in ms")
    print(f"{'mode/viewer':<15} {'viewers':>7} {'samples':>7} {'missed':>6} {'p50':>8} {'p95':>8} {'max':>8} {'POST p50':>9}")
    rows: list[dict[str, Any]] = []
    for mode in options.modes:
        for kind in options.viewer:
            try:
                rows.extend(run_mode(mode, options.viewers, options.posts, kind, options.app, options.repeat))
            except Unavailable as exc:
                print(f"{mode:<15} skipped: {exc}")
    if options.repeat > 1:
        print(f"best of {options.repeat} (lowest p95) per configuration:")
        for key in dict.fromkeys((row["mode"], row["viewers"]) for row in rows):
            print_row(min((r for r in rows if (r["mode"], r["viewers"]) == key), key=lambda r: r["p95"]))
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
