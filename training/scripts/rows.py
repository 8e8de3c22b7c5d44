"""What the offline scripts share about the rows `approxy train collect` writes: the held-out
split `approxy train fit` uses, and the shards of a rows directory."""
import pathlib
import numpy as np
from safetensors.numpy import load_file

M = (1 << 64) - 1


def held_out(pid, seed=7):
    """`approxy_training::fit::is_held_out`."""
    z = pid ^ ((seed * 0x9E3779B97F4A7C15) & M)
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M
    return (z ^ (z >> 31)) % 5 == 0


def load_shards(directory):
    """Every shard under `directory`, in file order, each with a `live` column (rows along
    live decodes are in `live-*.safetensors`)."""
    parts = []
    for p in sorted(pathlib.Path(directory).glob("*.safetensors")):
        t = load_file(str(p))
        t["live"] = np.full(len(t["labels"]), p.name.startswith("live-"))
        parts.append(t)
    return parts
