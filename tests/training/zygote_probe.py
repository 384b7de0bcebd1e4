"""A program for tests/test_zygote.py: says which process started it and whether torch was already imported, then
exits with the status its first argument names, or waits for a signal when it is ``wait``."""

import os
import sys
import time

print(
    f"pid={os.getpid()} ppid={os.getppid()} torch_imported={'torch' in sys.modules} argv={sys.argv[1:]}",
    flush=True,
)
if sys.argv[1:2] == ["wait"]:
    while True:
        time.sleep(1)
sys.exit(int(sys.argv[1]) if sys.argv[1:] else 0)
