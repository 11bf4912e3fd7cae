"""Registers, spills and shared memory of the Triton kernels, compiled on a CPU.

No GPU is needed: Triton compiles :mod:`~sparsefinder.attention.triton_block_sparse`'s kernel
for a CUDA target (``--arch``, default 90: H100/H200) with the ptxas it ships, and
``cuobjdump`` reads each cubin's registers per thread and stack (spilled) bytes; Triton
reports the dynamic shared memory. That is what decides whether a program of ``query_tile``
rows at ``num_warps`` fits a streaming multiprocessor, before any timing on a GPU. Sizes: the
default long-context selection (block 32, ``--k-max`` 4 key blocks, ``--g-max`` 512 single
keys, head dim 64). A second table does the same for the support check's kernel
(:mod:`~sparsefinder.attention.triton_support_check`: one query block against ``--key-tiles``
keys a step). Nothing here is timed.

    .venv/bin/python benchmarks/kernel_resources.py [--dtypes fp16,fp32] [--tiles 16,32]
        [--warps 4,8,16] [--g-max 512] [--head-dim 64] [--arch 90]

Last line, for the kernels' own defaults (the first dtype): ``registers=<r>
stack_bytes=<s> shared_kib=<k> query_tile=<t> num_warps=<w> check_registers=<r>
check_stack_bytes=<s>``. ``--smoke``: one tiny
configuration.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

# The kernel must be compiled, not interpreted: read before triton is first imported.
os.environ.pop("TRITON_INTERPRET", None)
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import parse, parser, skip  # noqa: E402

_RESOURCES = re.compile(r"REG:(\d+) STACK:(\d+)")


def compile_kernel(dtype: str, *, block: int, k_max: int, g_max: int, head_dim: int,
                   query_tile: int, num_warps: int, arch: int) -> tuple[int, int, int]:
    """(registers per thread, stack bytes per thread, dynamic shared bytes) of one
    configuration of the kernel compiled for ``sm_<arch>``."""
    from sparsefinder.attention.triton_block_sparse import N_ITER, _kernel

    kernel = _kernel()
    signature = {name: "*i32" for name in ("slots_ptr", "counts_ptr", "rows_ptr", "extra_ptr",
                                           "extra_counts_ptr")}
    signature.update({name: f"*{dtype}" for name in ("q_ptr", "k_ptr", "v_ptr", "out_ptr")})
    signature.update(thresholds_ptr="*fp32", n="i32", nb="i32", padded="i32", scaling="fp32")
    constants = dict(D=head_dim, DV=head_dim, BLOCK=block, BLOCK_M=query_tile, K_MAX=k_max,
                     G_MAX=g_max, CAUSAL=False, WINDOW=0, ITERS=N_ITER, PRECISION="ieee",
                     THRESHOLDS=True)
    return _resources(kernel, signature, constants, num_warps, arch)


def compile_check(dtype: str, *, block: int, key_tile: int, head_dim: int, num_warps: int,
                  arch: int) -> tuple[int, int, int]:
    """The same for the support check's kernel (bidirectional)."""
    from sparsefinder.attention.triton_support_check import _kernel

    signature = {"q_ptr": f"*{dtype}", "k_ptr": f"*{dtype}", "graph_ptr": "*u8",
                 "bits_ptr": "*u8", "worst_ptr": "*fp32", "n": "i32", "nb": "i32",
                 "padded": "i32", "scaling": "fp32"}
    constants = dict(D=head_dim, BLOCK=block, BLOCK_N=key_tile, CAUSAL=False, WINDOW=0,
                     PRECISION="ieee")
    return _resources(_kernel(), signature, constants, num_warps, arch)


def _resources(kernel, signature: dict, constants: dict, num_warps: int,  # noqa: ANN001
               arch: int) -> tuple[int, int, int]:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    signature = {**signature, **{name: "constexpr" for name in constants}}
    source = ASTSource(fn=kernel, signature=signature, constexprs={
        (kernel.arg_names.index(name),): value for name, value in constants.items()})
    compiled = triton.compile(source, target=GPUTarget("cuda", arch, 32),
                              options={"num_warps": num_warps})
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.TemporaryDirectory() as folder:
        cubin = Path(folder) / "kernel.cubin"
        cubin.write_bytes(compiled.asm["cubin"])
        usage = subprocess.run([str(tool), "--dump-resource-usage", str(cubin)],
                               capture_output=True, text=True, check=True).stdout
    found = _RESOURCES.search(usage)
    if found is None:
        raise RuntimeError(f"cuobjdump printed no resource usage: {usage[-400:]}")
    return int(found[1]), int(found[2]), int(compiled.metadata.shared)


def main() -> int:
    made = parser(__doc__.splitlines()[0])
    made.add_argument("--dtypes", default="fp16,fp32", help="comma-separated: fp16,bf16,fp32")
    made.add_argument("--tiles", default="16,32", help="query rows per program")
    made.add_argument("--warps", default="4,8,16")
    made.add_argument("--block", type=int, default=32)
    made.add_argument("--k-max", type=int, default=4)
    made.add_argument("--g-max", type=int, default=512)
    made.add_argument("--head-dim", type=int, default=64)
    made.add_argument("--arch", type=int, default=90)
    made.add_argument("--key-tiles", default="32,64,128", help="the check's keys per step")
    args = parse(made, smoke={"dtypes": "fp16", "tiles": "16", "warps": "4", "block": 16,
                              "k_max": 2, "g_max": 16, "head_dim": 16, "key_tiles": "16"})
    try:
        import triton  # noqa: F401
        from triton.compiler import ASTSource  # noqa: F401
    except ImportError as error:
        skip(f"needs triton's compiler ({error})")
        return 0
    from sparsefinder.attention.triton_block_sparse import default_num_warps

    dtypes = args.dtypes.split(",")
    tiles = [int(t) for t in args.tiles.split(",")]
    default_tile = min(args.block, 16)
    default_warps = default_num_warps(default_tile * (args.k_max * args.block + args.g_max))
    configs = [(d, t, int(w)) for d in dtypes for t in tiles for w in args.warps.split(",")]
    if (dtypes[0], default_tile, default_warps) not in configs:
        configs.insert(0, (dtypes[0], default_tile, default_warps))
    print(f"sm_{args.arch}, block {args.block}, K_MAX {args.k_max}, G_MAX {args.g_max}, "
          f"head dim {args.head_dim}; kernel defaults: query tile {default_tile}, "
          f"{default_warps} warps")
    results = _table(configs, "query tile", "scores/program",
                     lambda tile: tile * (args.k_max * args.block + args.g_max),
                     lambda dtype, tile, warps: compile_kernel(
                         dtype, block=args.block, k_max=args.k_max, g_max=args.g_max,
                         head_dim=args.head_dim, query_tile=tile, num_warps=warps,
                         arch=args.arch))
    registers, stack, shared = results[(dtypes[0], default_tile, default_warps)]
    check = _check_table(args, dtypes)
    print(f"registers={registers} stack_bytes={stack} shared_kib={shared / 1024:.0f} "
          f"query_tile={default_tile} num_warps={default_warps} check_registers={check[0]} "
          f"check_stack_bytes={check[1]}")
    return 0


def _check_table(args, dtypes: list[str]) -> tuple[int, int, int]:  # noqa: ANN001
    """The support check kernel's table; returns its defaults' resources (first dtype)."""
    from sparsefinder.attention.triton_support_check import (
        KEY_TILE,
        KEY_TILE_FP32,
        default_num_warps,
    )

    tiles = [int(t) for t in args.key_tiles.split(",")]
    configs = [(d, t, w) for d in dtypes for t in tiles for w in (4, 8)]
    tile = KEY_TILE_FP32 if dtypes[0] == "fp32" else KEY_TILE
    default = (dtypes[0], tile, default_num_warps(args.block, tile))
    if default not in configs:
        configs.insert(0, default)
    print(f"\nThe support check: one query block of {args.block} rows, head dim "
          f"{args.head_dim}; defaults: {tile} keys a step ({dtypes[0]}), {default[2]} warps")
    results = _table(configs, "keys a step", "scores/step", lambda tile: args.block * tile,
                     lambda dtype, tile, warps: compile_check(
                         dtype, block=args.block, key_tile=tile, head_dim=args.head_dim,
                         num_warps=warps, arch=args.arch))
    return results[default]


def _table(configs: list[tuple[str, int, int]], tile_name: str, scores_name: str,
           scores, compile_one) -> dict:  # noqa: ANN001
    """Compile each (dtype, tile, warps) configuration and print its row as it comes:
    registers, stack bytes and shared KiB. Returns {configuration: resources}."""
    print(f"| dtype | {tile_name} | warps | {scores_name} | registers | stack bytes (spill) |"
          " shared KiB |")
    print("|---|---|---|---|---|---|---|")
    results = {}
    for dtype, tile, warps in configs:
        registers, stack, shared = results[(dtype, tile, warps)] = compile_one(dtype, tile,
                                                                               warps)
        print(f"| {dtype} | {tile} | {warps} | {scores(tile)} | {registers} | {stack} | "
              f"{shared / 1024:.0f} |", flush=True)
    return results


if __name__ == "__main__":
    raise SystemExit(main())
