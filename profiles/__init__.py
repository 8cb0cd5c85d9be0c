"""placeflow.profiles: kernel profiler, profile files and the profile-backed cost model.

- `schema`: the versioned profile file format with provenance.
- `ops`: per-op features (interpolation axis, FLOPs, bytes).
- `profiler` and `collectives`: time real torch kernels on the local device.
- `vidur` and `datasheet`: build GPU profiles from Vidur's measured CSVs and datasheet figures.
- `registry`: the shipped profiles in `data/` and lookup by name or path.
- `costmodel`: fit (an explicit step) and query op times.
"""
