"""The cost curve of a target on mainline llama.cpp with its extra weight buffers (AMX, CPU
repacking) on, off or as specwise chooses (auto), and whether the installed build has AMX
kernels. Run it in each venv whose llama.cpp build is to be compared.

Usage: python scripts/amx_curve.py auto|on|off [--model qwen2.5-coder-1.5b-instruct]
"""

import argparse

from specwise.backends import resolve_model
from specwise.backends.curves import measure_curve
from specwise.backends.llama_cpp import LlamaCppLM, build_has_amx

p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
p.add_argument("buffers", choices=["auto", "on", "off"])
p.add_argument("--model", default="qwen2.5-coder-1.5b-instruct", help="catalog name or file")
p.add_argument("--sizes", default="1,2,4,8,16")
p.add_argument("--repeats", type=int, default=5)
a = p.parse_args()
extra = {"auto": None, "on": True, "off": False}[a.buffers]
lm = LlamaCppLM(resolve_model(a.model), extra_buffers=extra)
sizes = [int(x) for x in a.sizes.split(",")]
print(build_has_amx(), measure_curve(lm, sizes=sizes, repeats=a.repeats).ms)
