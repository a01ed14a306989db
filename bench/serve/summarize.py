#!/usr/bin/env python3
"""The short form of specd-bench-serve records, for bench/results: one row a
label and level (throughput, latency percentiles, the longest inter-token
gap, acceptance, the engine's steps by draft length and queued ahead).

  bench/serve/summarize.py [--sub OLD=NEW]... [--group NAME] FILE.json... > summary.json

Each --group names the files after it (e.g. one build's labels in one
round); the output is {"groups": [{"name", "files": [{"label", "commit",
"command", "machine", "levels": [...]}]}]}. --sub replaces text in the commands (e.g. a scratch
folder's path by a name)."""
import json
import sys


def level(r):
    s = r["summary"]
    sp = r.get("server_speculative") or {}
    row = {
        "concurrency": r.get("concurrency"),
        "requests": s.get("completed"),
        "failed": s.get("failed"),
        "duration_s": s.get("duration_s"),
        "out_tok_s": s.get("output_throughput"),
        "ttft_p50_ms": s.get("median_ttft_ms"),
        "ttft_p99_ms": s.get("p99_ttft_ms"),
        "tpot_p50_ms": s.get("median_tpot_ms"),
        "itl_p99_ms": s.get("p99_itl_ms"),
        "itl_max_ms": s.get("max_itl_ms"),
    }
    for k in ("acceptance_rate", "mean_accepted_length", "engine_steps_by_k",
              "engine_launch_ahead_steps", "engine_draft_ahead_steps", "proposer_eager_passes",
              "engine_gemm_trials", "engine_prompt_steps", "engine_prompt_graph_steps",
              "engine_drafting_steps_by_why", "engine_drafting_idle_by_why",
              "engine_not_ahead_steps_by_cause", "engine_cohorts"):
        if sp.get(k) is not None:
            row[k] = sp[k]
    return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()}


def main(argv):
    groups, cur, subs = [], None, []
    it = iter(argv)
    for a in it:
        if a == "--sub":
            subs.append(next(it).split("=", 1))
            continue
        if a == "--group":
            cur = {"name": next(it), "files": []}
            groups.append(cur)
            continue
        if cur is None:
            cur = {"name": "", "files": []}
            groups.append(cur)
        d = json.load(open(a))
        cmd = (d.get("runs") or [{}])[0].get("command", d.get("command")) or ""
        for old, new in subs:
            cmd = cmd.replace(old, new)
        m = d.get("machine")
        cur["files"].append({
            "label": d.get("label"),
            "commit": d.get("commit"),
            "command": cmd,
            "machine": m.get("label") if isinstance(m, dict) else m,
            "levels": [level(r) for r in d.get("runs", [])],
        })
    json.dump({"groups": groups}, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main(sys.argv[1:])
