"""``python -m megatron_topo.config``: every key, its type, default and valid values;
``--neox-table``: the GPT-NeoX compatibility table (docs/neox_compat.md)."""

import sys

from . import describe_keys, neox_table_markdown

print(neox_table_markdown() if "--neox-table" in sys.argv[1:] else describe_keys())
