#!/usr/bin/env python3
"""Mean of one dataset over many HDF5 files, computed by MPI ranks.

Each rank reads its share of the files and sums the dataset; rank 0 gathers the sums and
writes the mean to $ANALYSIS_OUTPUT/summary.h5.

    mpirun python3 /opt/analysis/reduce.py DATASET FILE...
"""
import os
import sys

import h5py
import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
if len(sys.argv) < 3:
    if comm.rank == 0:
        print(__doc__, file=sys.stderr)
    sys.exit(2)
dataset, files = sys.argv[1], sys.argv[2:]

# [sum of values, number of values] of this rank's files.
local = np.zeros(2)
for path in files[comm.rank :: comm.size]:
    with h5py.File(path, "r") as f:
        data = np.asarray(f[dataset], dtype=np.float64)
    local += (data.sum(), data.size)

total = np.zeros(2) if comm.rank == 0 else None
comm.Reduce(local, total, op=MPI.SUM, root=0)
if comm.rank == 0:
    mean = total[0] / max(total[1], 1)
    out = os.path.join(os.environ.get("ANALYSIS_OUTPUT", "."), "summary.h5")
    with h5py.File(out, "w") as f:
        f.attrs["dataset"] = dataset
        f.attrs["files"] = len(files)
        f.attrs["values"] = int(total[1])
        f.attrs["mean"] = mean
    print(f"{dataset}: mean {mean:.6g} over {int(total[1])} values in {len(files)} files -> {out}")
