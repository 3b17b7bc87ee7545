#!/usr/bin/env python3
"""FP8 E4M3 conversions by torch (float8_e4m3fn), the reference for
model/dtype.hpp's e4m3_to_f32 / f32_to_e4m3 (tests/model/dtype_test.cpp).

Runs on the GPU machine (torch is not installed here):
  python3 tools/golden/e4m3_reference.py --out tools/golden/e4m3.json

Writes {"decode": [256 float bit patterns, code 0..255, NaN as null],
"encode": [[float bits, code], ...]} for every code's value, the midpoints
between neighbouring codes (ties to even), points a float ulp either side of
them, values past 448 (saturated: torch's float8_e4m3fn conversion of a value
above 448 gives NaN, so those inputs are clamped to +-448 first, which is what
the KV cache's writer does with `satfinite`), the subnormal range, and random
floats over the whole range.
"""
import argparse
import json
import struct

import torch


def bits(x: float) -> int:
    return struct.unpack("<I", struct.pack("<f", x))[0]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    codes = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn)
    values = codes.to(torch.float32).tolist()
    decode = [None if v != v else bits(v) for v in values]

    finite = sorted({v for v in values if v == v and v >= 0})
    pts = []
    for v in finite:
        pts += [v, -v]
    for a, b in zip(finite, finite[1:]):
        mid = (a + b) / 2
        up = torch.nextafter(torch.tensor(mid), torch.tensor(1e9)).item()
        down = torch.nextafter(torch.tensor(mid), torch.tensor(-1e9)).item()
        for p in (mid, up, down):
            pts += [p, -p]
    pts += [448.0, 449.0, 463.9, 464.0, 480.0, 1e4, 3e38, float("inf")]
    pts += [-p for p in pts[-8:]]
    pts += [2.0 ** -10, 2.0 ** -11, 3 * 2.0 ** -11, 1e-30, 0.0, -0.0]
    g = torch.Generator().manual_seed(7)
    pts += (torch.randn(2000, generator=g) * 60).tolist()
    pts += (torch.rand(500, generator=g) * 2.0 ** -6).tolist()

    x = torch.tensor(pts, dtype=torch.float32)
    clamped = x.clamp(-448.0, 448.0)
    enc = clamped.to(torch.float8_e4m3fn).view(torch.uint8).tolist()
    encode = [[bits(p), c] for p, c in zip(x.tolist(), enc)]

    with open(args.out, "w") as f:
        json.dump({"source": f"torch {torch.__version__} float8_e4m3fn",
                   "decode": decode, "encode": encode}, f, separators=(",", ":"))
        f.write("\n")


if __name__ == "__main__":
    main()
