#!/usr/bin/env python3
"""Wall time of N concurrent completions against a running `ditto serve`, greedy and sampled.

    ./ditto serve --port 18091 --threads 2 --quiet &
    python3 bench/serve_sampling.py http://127.0.0.1:18091

Each request: prompt "reader", 200 tokens, ignore_eos; sampled ones at the default temperature
(1) with seeds 1..N. Prints the best of 3 rounds per case as a markdown table."""
import json
import sys
import threading
import time
import urllib.request


def request(base, body):
    r = urllib.request.Request(base + "/v1/completions", data=json.dumps(body).encode(),
                               headers={"Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(r).read())


def timed(base, body, n):
    def one(i):
        request(base, dict(body, seed=i + 1))
    t0 = time.time()
    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.time() - t0


def main():
    base = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8080"
    req = {"prompt": "reader", "max_tokens": 200, "ignore_eos": True}
    print("| requests | seconds (best of 3) | tok/s |\n|---|---:|---:|")
    for name, body, n in [("greedy x1", dict(req, temperature=0), 1), ("sampled x1", req, 1),
                          ("greedy x4", dict(req, temperature=0), 4), ("sampled x4", req, 4),
                          ("sampled x8", req, 8)]:
        best = min(timed(base, body, n) for _ in range(3))
        print(f"| {name} | {best:.2f} | {n * 200 / best:.0f} |")


if __name__ == "__main__":
    main()
