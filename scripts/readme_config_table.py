#!/usr/bin/python3
"""Replaces the config reference table in README.md with `trainer config --reference`.

Usage: scripts/readme_config_table.py [TRAINER]  (default build/trainer). The table is the block
of lines starting with '| Key | Type |' and the '|'-lines after it.
"""
import subprocess
import sys

trainer = sys.argv[1] if len(sys.argv) > 1 else "build/trainer"
table = subprocess.run([trainer, "config", "--reference"], check=True, capture_output=True,
                       text=True).stdout.strip().splitlines()
table = [line for line in table if line.startswith("|")]
lines = open("README.md").read().splitlines()
start = next(i for i, line in enumerate(lines) if line.startswith("| Key | Type |"))
end = start
while end < len(lines) and lines[end].startswith("|"):
    end += 1
lines[start:end] = table
open("README.md", "w").write("\n".join(lines) + "\n")
print(f"README.md: config table of {len(table) - 2} keys")
