"""Dry-run every GPT-NeoX config file under a folder (a GPT-NeoX checkout's ``configs/``) as it is,
one file at a time with only the vocabulary supplied (``vocab_size``, as a tokenizer would give it),
and print a Markdown table: file, pass/refused, and every refusal's reason (one ``error:`` line
each, as train.py would print them). The last line is the count.

    python tools/check_neox_configs.py ~/gpt-neox/configs [--vocab-size 50304] [--world-size 8]

A file passes when ``train.py FILE --set vocab_size=N --dry-run --world-size W`` would exit 0.
"""

from __future__ import annotations

import argparse
import io
import os
import sys

from megatron_topo.cli import OneLineParser, interruptible, number, path_arg
from megatron_topo.error_lines import clean, escaped, first_line


def check_file(path: str, vocab_size: int, world_size: int) -> list[str]:
    """The problem lines of one file's dry run (empty: it passes)."""
    from megatron_topo import dryrun
    from megatron_topo.config import ConfigError, load_config

    try:
        cfg = load_config([path], [f"vocab_size={vocab_size}"])
        dryrun.main(cfg, world_size, 0, None, io.StringIO())
    except ConfigError as e:
        return list(getattr(e, "problems", None) or [str(e)])
    except (ValueError, OSError) as e:
        return [first_line(e)]
    return []


def _short(line: str, path: str) -> str:
    return line.replace(f"{path}: ", "").replace("|", "/")


@interruptible(preload=("numpy",))
def main(argv=None) -> int:
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    ap = OneLineParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        usage_line="python tools/check_neox_configs.py CONFIGS_DIR [--vocab-size N] [--world-size W]",
    )
    ap.add_argument("folder", type=path_arg, help="a GPT-NeoX checkout's configs/ folder (every *.yml under it)")
    ap.add_argument(
        "--vocab-size",
        type=number(int),
        default=50304,
        help="vocab_size supplied to every file (default 50304: GPT-NeoX-20B's tokenizer padded)",
    )
    ap.add_argument("--world-size", type=number(int), default=8, help="ranks of the dry run (default 8)")
    args = ap.parse_args(argv)
    from megatron_topo.commands.train import DRY_RUN_MAX_WORLD

    if not 1 <= args.world_size <= DRY_RUN_MAX_WORLD:  # the dry run's time grows with the world
        ap.error(f"--world-size {args.world_size}: must lie in 1..{DRY_RUN_MAX_WORLD:,} (2**17), as train.py --dry-run")
    if not 1 <= args.vocab_size <= 1 << 31:
        ap.error(f"--vocab-size {args.vocab_size}: must lie in 1..2**31")
    if not os.path.isdir(args.folder):
        print(clean(f"error: {args.folder}: not a folder"), file=sys.stderr)
        return 2
    files = sorted(
        os.path.join(d, f) for d, _, names in os.walk(args.folder) for f in names if f.endswith((".yml", ".yaml"))
    )
    passed = 0
    print("| File | Result | Reasons |")
    print("|---|---|---|")
    for path in files:
        problems = check_file(path, args.vocab_size, args.world_size)
        passed += not problems
        rel = os.path.relpath(path, args.folder).replace("|", "\\|")  # a '|' in a name is no column
        why = "<br>".join(_short(p, path) for p in problems)
        # a file name or a reason holding ESC or a line break is shown escaped: one row, no terminal control
        print(escaped(f"| `{rel}` | {'refused' if problems else 'passes'} | {why} |"), flush=True)
    print(
        f"\n{passed} of {len(files)} files pass (dry run, unchanged, vocab_size={args.vocab_size}, "
        f"world size {args.world_size})"
    )
    return 0
