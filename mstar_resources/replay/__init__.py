"""Proof in an engine's loop: a serving trace replayed on sealed, calibrated pools, on one GPU or
on tensor-parallel ranks, against the engines' one fixed buffer (``scripts/replay.py``).

``trace`` (the requests), ``trace_rows`` and ``trace_file`` (a production trace file),
``workload`` and ``scheduler`` are plain Python (what runs each step); ``roles`` says which plan
labels the replay plans; ``model``, ``attention`` (FlashInfer's wrappers and their plan inputs),
``buffers``, ``graphs`` and ``engine`` (the serving setup) run it on a GPU; ``report`` prints and
writes what it found; ``cli`` is the Hydra app and ``settings`` its settings.
"""
