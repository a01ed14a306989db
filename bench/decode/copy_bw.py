#!/usr/bin/env python3
"""GPU copy bandwidth for the decode floor (bench/decode): a device-to-device
torch copy_ of SIZE bytes (default 4 GiB), timed with CUDA events, median of
20 after 3 warm-ups; bandwidth = (bytes read + bytes written) / time.

    python3 bench/decode/copy_bw.py [--bytes N] [--out FILE.json]
"""
import argparse
import json

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bytes", type=int, default=4 << 30)
    ap.add_argument("--out")
    a = ap.parse_args()
    x = torch.ones(a.bytes, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    for _ in range(3):
        y.copy_(x)
    torch.cuda.synchronize()
    times = []
    for _ in range(20):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        y.copy_(x)
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) * 1e-3)
    times.sort()
    t = times[len(times) // 2]
    r = {"copy_bw_gbs": 2 * a.bytes / t / 1e9, "bytes": a.bytes, "median_s": t,
         "best_gbs": 2 * a.bytes / times[0] / 1e9, "device": torch.cuda.get_device_name(),
         "method": "torch copy_ device to device, (read + write bytes) / time, median of 20"}
    print(json.dumps(r))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(r, f, indent=2)


if __name__ == "__main__":
    main()
